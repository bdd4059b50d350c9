"""``Progress``: hands the trainer's results to what shows them.

The trainer gives it metrics in blocks fetched from the device and validations as they
finish; it records them in a ``History`` and passes them on: MATLAB's verbose table,
``output_fn`` (which may ask to stop), and any sinks (the training-progress plot, a
TensorBoard writer), each an object with ``update(info)`` and ``close(info)``. Nothing
here touches JAX.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from jaxflowers.training.history import History
from jaxflowers.training.info import TrainingInfo
from jaxflowers.training.table import VerboseTable


class Progress:
    """Records a training's results and reports them.

    Args:
      history: where results are recorded (a resumed run passes the one it restored).
      table: the verbose table, or None for no table.
      output_fn: called with one dict per iteration (and per validation and state change);
        returning True asks training to stop.
      sinks: objects with ``update(info)`` (called at every report) and ``close(info)``
        (called once with the final ``TrainingInfo``).
    """

    def __init__(self, history: History, *, table: VerboseTable | None = None,
                 output_fn: Callable[[dict], Any] | None = None, sinks: Sequence = ()):
        self.history, self.table, self.output_fn = history, table, output_fn
        self.sinks = list(sinks)
        self.stop_requested = False

    @property
    def iterations_done(self) -> int:
        return self.history.iterations_done

    def start(self, summary: str) -> None:
        """Print ``summary`` and the table header; tell ``output_fn`` training starts."""
        self._send({"state": "start"})
        if self.table is not None:
            self.table.header(summary)

    def add(self, loss: np.ndarray, accuracy: np.ndarray, learn_rate: np.ndarray) -> None:
        """Record a block of consecutive iterations (accuracy as a fraction)."""
        added = self.history.add(loss, accuracy, learn_rate)
        if self.output_fn is not None:
            for it in added:
                self._send({"state": "iteration", **self.history.row(it)})

    def add_validation(self, iteration: int, scores: dict) -> None:
        """Record the validation at ``iteration`` (``metrics.score``'s scores: accuracy in
        %); ``output_fn`` sees each as ``validation_<name>``."""
        self.history.add_validation(iteration, scores)
        message = {"state": "validation", "iteration": iteration,
                   "epoch": self.history.epoch(iteration)}
        if 0 < iteration <= self.iterations_done:
            message = {"state": "validation", **self.history.row(iteration)}
        self._send(dict(message, **{f"validation_{k}": v
                                    for k, v in self.history.validation_at(iteration).items()}))

    def show(self, info: Callable[[], TrainingInfo] | None = None) -> None:
        """Print the table rows due; update the sinks with ``info()`` (the record so far)."""
        if self.table is not None:
            self.table.rows()
        if self.sinks:
            current = info() if info is not None else self.history.info()
            for sink in self.sinks:
                sink.update(current)

    def close(self, **fields) -> TrainingInfo:
        """Close the table, the sinks and ``output_fn``'s stream; the final ``TrainingInfo``."""
        info = self.history.info(**fields)
        if self.table is not None:
            self.table.rows(final=True)
            self.table.footer(info.stop_reason)
        for sink in self.sinks:
            sink.close(info)
        done = self.iterations_done
        message = {"state": "done", "iteration": done, "epoch": self.history.epoch(done),
                   "stop_reason": info.stop_reason,
                   "final_validation_accuracy": info.final_validation_accuracy}
        self._send(message)
        return info

    def _send(self, message: dict) -> None:
        if self.output_fn is not None and self.output_fn(message) is True:
            self.stop_requested = True
