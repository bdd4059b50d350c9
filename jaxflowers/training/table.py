"""MATLAB's verbose training table, printed from a ``History``."""
from __future__ import annotations

import sys
import time

from jaxflowers.host.clock import hms
from jaxflowers.training.history import History

_COLUMNS = ("Epoch", "Iteration", "Time Elapsed", "Mini-batch", "Validation", "Mini-batch",
            "Validation", "Base Learning")
_COLUMNS_2 = ("", "", "(hh:mm:ss)", "Accuracy", "Accuracy", "Loss", "Loss", "Rate")
_WIDTHS = (7, 11, 14, 12, 12, 12, 12, 15)
# Column titles of the validation metrics (``TrainingOptions.metrics``), after the losses.
_METRIC_TITLES = {"fscore": "FScore", "precision": "Precision", "recall": "Recall",
                  "auc": "AUC"}


class VerboseTable:
    """MATLAB's ``Verbose`` table of ``history``: the first, every ``frequency``-th
    (``VerboseFrequency``), validated and last rows, printed to ``stream`` (default stdout)."""

    def __init__(self, history: History, frequency: int, stream=None):
        self.history, self.frequency = history, frequency
        self.stream = stream or sys.stdout
        self._printed = self._last_row = history.iterations_done
        self._t0 = time.perf_counter()
        metrics = history.metrics
        self._columns = (_COLUMNS[:7] + ("Validation",) * len(metrics) + _COLUMNS[7:],
                         _COLUMNS_2[:7] + tuple(_METRIC_TITLES[m] for m in metrics)
                         + _COLUMNS_2[7:])
        self._widths = _WIDTHS[:7] + (12,) * len(metrics) + _WIDTHS[7:]
        self._rule = "|" + "=" * (sum(self._widths) + 3 * len(self._widths) - 1) + "|"

    def header(self, summary: str) -> None:
        """Print ``summary`` and the column names; start the clock."""
        self._t0 = time.perf_counter()
        print(summary, file=self.stream)
        for names in (None, *self._columns, None):
            print(self._rule if names is None else "|" + "|".join(
                f" {n:^{w}} " for n, w in zip(names, self._widths)) + "|", file=self.stream)

    def rows(self, *, final: bool = False) -> None:
        """Print the rows due up to the last recorded iteration (and it too, if ``final``)."""
        done = self.history.iterations_done
        validated = set(self.history.validations["iteration"])
        due = [it for it in range(self._printed + 1, done + 1)
               if it == 1 or it % self.frequency == 0 or it in validated]
        if final and done > self._last_row and done not in due:
            due.append(done)
        for it in due:
            print(self._row(it), file=self.stream)
            self._last_row = it
        self._printed = done
        self.stream.flush()

    def footer(self, stop_reason: str) -> None:
        """Close the table and say why training ended (MATLAB's "Training finished: ...")."""
        print(self._rule, file=self.stream)
        print(f"Training finished: {stop_reason}.", file=self.stream, flush=True)

    def _row(self, iteration: int) -> str:
        row = self.history.row(iteration)
        validation = self.history.validation_at(iteration)
        v = validation or {}
        cells = (row["epoch"], iteration,
                 hms(time.perf_counter() - self._t0),
                 f"{row['accuracy']:.2f}%", f"{v['accuracy']:.2f}%" if v else "",
                 _number(row["loss"]), _number(v["loss"]) if v else "",
                 *(f"{v[m]:.4f}" if v else "" for m in self.history.metrics),
                 f"{row['learn_rate']:.4g}")
        return "|" + "|".join(f" {str(c):>{w}} " for c, w in zip(cells, self._widths)) + "|"


def _number(value: float) -> str:
    """A loss in a table cell: 4 decimals, or 4 significant digits once it is large."""
    return f"{value:.4f}" if abs(value) < 1e5 else f"{value:.4g}"
