"""MATLAB's verbose training table, printed from a ``History``: trainnet's layout, columns of
two header lines under a rule, 82 characters wide (each validation metric adds 8 to 11)."""
from __future__ import annotations

import contextlib
import sys
import time

from jaxflowers.host.clock import hms
from jaxflowers.options.training import METRIC_NAMES
from jaxflowers.training.history import History

__all__ = ["VerboseTable"]

# (first header line, second header line, width) of each column, in MATLAB's order.
_COLUMNS = (("Epoch", "", 5), ("Iteration", "", 9), ("Elapsed", "hh:mm:ss", 8),
            ("Training", "accuracy", 8), ("Validation", "accuracy", 10),
            ("Training", "loss", 9), ("Validation", "loss", 10), ("Learning", "rate", 8))
_GAP = "  "


class VerboseTable:
    """MATLAB's ``Verbose`` table of ``history``: the first, every ``frequency``-th
    (``VerboseFrequency``), validated and last rows, printed to ``stream`` (default stdout);
    ``writing`` is a context each print runs in (a progress bar's, to print above it)."""

    def __init__(self, history: History, frequency: int, stream=None, writing=None):
        self.history, self.frequency = history, frequency
        self.stream = stream or sys.stdout
        self._writing = writing or contextlib.nullcontext
        self._printed = self._last_row = history.iterations_done
        self._t0 = time.perf_counter()
        # the validation metrics (TrainingOptions.metrics), after the losses
        metrics = tuple((METRIC_NAMES[m], "", max(6, len(METRIC_NAMES[m])))
                        for m in history.metrics)
        self._columns = _COLUMNS[:7] + metrics + _COLUMNS[7:]

    def header(self, summary: str) -> None:
        """Print ``summary`` and the column names; start the clock."""
        self._t0 = time.perf_counter()
        lines = [summary,
                 *(self._line(column[i] for column in self._columns) for i in (0, 1)),
                 self._line("-" * width for *_, width in self._columns)]
        self._print("\n".join(lines))

    def rows(self, *, final: bool = False) -> None:
        """Print the rows due up to the last recorded iteration (and it too, if ``final``)."""
        done = self.history.iterations_done
        validated = set(self.history.validations["iteration"])
        due = [it for it in range(self._printed + 1, done + 1)
               if it == 1 or it % self.frequency == 0 or it in validated]
        if final and done > self._last_row and done not in due:
            due.append(done)
        if due:
            self._print("\n".join(self._row(it) for it in due))
            self._last_row = due[-1]
        self._printed = done

    def footer(self, stop_reason: str) -> None:
        """Close the table and say why training ended (MATLAB's "Training finished: ...")."""
        self._print(f"{self._line('-' * width for *_, width in self._columns)}\n"
                    f"Training finished: {stop_reason}.")

    def _print(self, text: str) -> None:
        with self._writing():
            print(text, file=self.stream, flush=True)

    def _line(self, cells) -> str:
        return " " + _GAP.join(f"{str(cell):>{width}}"
                               for cell, (*_, width) in zip(cells, self._columns))

    def _row(self, iteration: int) -> str:
        row = self.history.row(iteration)
        v = self.history.validation_at(iteration) or {}
        return self._line((
            row["epoch"], iteration, hms(time.perf_counter() - self._t0),
            f"{row['accuracy']:.2f}%", f"{v['accuracy']:.2f}%" if v else "",
            _number(row["loss"]), _number(v["loss"]) if v else "",
            *(f"{v[m]:.4f}" if v else "" for m in self.history.metrics),
            f"{row['learn_rate']:.4g}"))


def _number(value: float) -> str:
    """A loss in a table cell: 4 decimals, or 4 significant digits once it is large."""
    return f"{value:.4f}" if abs(value) < 1e5 else f"{value:.4g}"
