"""Training progress: the per-iteration history, MATLAB's verbose table, ``output_fn`` and
the live plot. The trainer hands it metrics in blocks fetched from the device; nothing here
touches JAX.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

import numpy as np

from jaxflowers.info import TrainingInfo

_COLUMNS = ("Epoch", "Iteration", "Time Elapsed", "Mini-batch", "Validation", "Mini-batch",
            "Validation", "Base Learning")
_COLUMNS_2 = ("", "", "(hh:mm:ss)", "Accuracy", "Accuracy", "Loss", "Loss", "Rate")
_WIDTHS = (7, 11, 14, 12, 12, 12, 12, 15)


class Progress:
    """Collects metrics, prints the table, calls ``output_fn`` and feeds the live plot.

    Args:
      steps_per_epoch: iterations per epoch, to turn iterations into epochs.
      verbose: print the table; ``verbose_frequency`` iterations between rows.
      output_fn: called with one dict per iteration (and per validation); returning True
        asks training to stop.
      sinks: objects with ``update(info)``, called at every report, and ``close(info)``,
        called with the final info (the training-progress plot, the TensorBoard log).
    """

    def __init__(self, *, steps_per_epoch: int, verbose: bool = True, verbose_frequency: int = 50,
                 output_fn: Callable[[dict], Any] | None = None, sinks=(), stream=None):
        self.steps_per_epoch = steps_per_epoch
        self.verbose, self.verbose_frequency = verbose, verbose_frequency
        self.output_fn, self.sinks = output_fn, tuple(sinks)
        self.stream = stream or sys.stdout
        self._rows: dict[str, list] = {k: [] for k in ("loss", "accuracy", "learn_rate")}
        self._val: dict[str, list] = {k: [] for k in ("iteration", "loss", "accuracy")}
        self._printed = self._last_row = 0
        self.stop_requested = False
        self._t0 = time.perf_counter()

    @property
    def iterations_done(self) -> int:
        return len(self._rows["loss"])

    def start(self, summary: str) -> None:
        """Print ``summary`` and the table header; start the clock."""
        self._t0 = time.perf_counter()
        self._send({"state": "start"})
        if self.verbose:
            print(summary, file=self.stream)
            rule = "|" + "=" * (sum(_WIDTHS) + 3 * len(_WIDTHS) - 1) + "|"
            for names in (None, _COLUMNS, _COLUMNS_2, None):
                line = rule if names is None else "|" + "|".join(
                    f" {n:^{w}} " for n, w in zip(names, _WIDTHS)) + "|"
                print(line, file=self.stream)

    def add(self, loss: np.ndarray, accuracy: np.ndarray, learn_rate: np.ndarray) -> None:
        """Append a block of consecutive iterations (accuracy as a fraction)."""
        first = self.iterations_done + 1
        for key, values in (("loss", loss), ("accuracy", 100.0 * np.asarray(accuracy)),
                            ("learn_rate", learn_rate)):
            self._rows[key].extend(np.asarray(values, dtype=np.float64).tolist())
        if self.output_fn is not None:
            for it in range(first, self.iterations_done + 1):
                self._send(self._message(it, "iteration"))

    def add_validation(self, iteration: int, loss: float, accuracy: float) -> None:
        """Record a validation at ``iteration`` (accuracy as a fraction)."""
        for key, value in (("iteration", iteration), ("loss", loss), ("accuracy", 100 * accuracy)):
            self._val[key].append(value)
        self._send(dict(self._message(iteration, "validation"),
                        validation_loss=float(loss), validation_accuracy=100.0 * accuracy))

    def report(self, *, final: bool = False) -> None:
        """Print table rows due up to the last recorded iteration; refresh the live plot."""
        if self.verbose:
            due = [it for it in range(self._printed + 1, self.iterations_done + 1)
                   if it == 1 or it % self.verbose_frequency == 0 or it in self._val["iteration"]]
            if final and self.iterations_done > self._last_row and self.iterations_done not in due:
                due.append(self.iterations_done)
            for it in due:
                print(self._row(it), file=self.stream)
                self._last_row = it
            self._printed = self.iterations_done
            self.stream.flush()
        if self.sinks:
            info = self.info()
            for sink in self.sinks:
                sink.update(info)

    def finish(self, **timings) -> TrainingInfo:
        """Close the table and return the history as a ``TrainingInfo``."""
        self.report(final=True)
        if self.verbose:
            print("|" + "=" * (sum(_WIDTHS) + 3 * len(_WIDTHS) - 1) + "|", file=self.stream)
        info = self.info(**timings)
        for sink in self.sinks:
            sink.close(info)
        self._send(dict(self._message(self.iterations_done, "done"),
                        final_validation_accuracy=info.final_validation_accuracy))
        return info

    def info(self, **timings) -> TrainingInfo:
        iters = np.arange(1, self.iterations_done + 1)
        return TrainingInfo(
            iteration=iters, epoch=(iters - 1) // self.steps_per_epoch + 1,
            loss=np.asarray(self._rows["loss"]), accuracy=np.asarray(self._rows["accuracy"]),
            learn_rate=np.asarray(self._rows["learn_rate"]),
            validation_iteration=np.asarray(self._val["iteration"], dtype=np.int64),
            validation_loss=np.asarray(self._val["loss"], dtype=np.float64),
            validation_accuracy=np.asarray(self._val["accuracy"], dtype=np.float64),
            stopped_early=self.stop_requested, **timings)

    def _message(self, iteration: int, state: str) -> dict:
        i = iteration - 1
        message = {"state": state, "iteration": iteration,
                   "epoch": (iteration - 1) // self.steps_per_epoch + 1 if iteration else 0}
        if 0 <= i < self.iterations_done:
            message.update({k: v[i] for k, v in self._rows.items()})
        return message

    def _send(self, message: dict) -> None:
        if self.output_fn is not None and self.output_fn(message) is True:
            self.stop_requested = True

    def _row(self, iteration: int) -> str:
        i = iteration - 1
        val = {it: (loss, acc) for it, loss, acc in
               zip(self._val["iteration"], self._val["loss"], self._val["accuracy"])}
        v_loss, v_acc = val.get(iteration, (None, None))
        elapsed = int(time.perf_counter() - self._t0)
        cells = ((iteration - 1) // self.steps_per_epoch + 1, iteration,
                 f"{elapsed // 3600:02d}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}",
                 f"{self._rows['accuracy'][i]:.2f}%", "" if v_acc is None else f"{v_acc:.2f}%",
                 f"{self._rows['loss'][i]:.4f}", "" if v_loss is None else f"{v_loss:.4f}",
                 f"{self._rows['learn_rate'][i]:.4g}")
        return "|" + "|".join(f" {str(c):>{w}} " for c, w in zip(cells, _WIDTHS)) + "|"
