"""``Progress``: records the trainer's results in a ``History`` and hands them to the table,
the bar, ``output_fn`` and the sinks (plot, TensorBoard). No JAX."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from jaxflowers.training.bar import TrainingBar
from jaxflowers.training.history import History
from jaxflowers.training.info import TrainingInfo
from jaxflowers.training.table import VerboseTable

__all__ = ["Progress"]


class Progress:
    """Records a training's results in ``history`` and reports them.

    ``output_fn`` gets a dict per iteration, validation and state (True stops training);
    ``sinks`` are objects with ``update(info)`` and ``close(info)``.
    """

    def __init__(self, history: History, *, table: VerboseTable | None = None,
                 bar: TrainingBar | None = None,
                 output_fn: Callable[[dict], Any] | None = None, sinks: Sequence = ()):
        self.history, self.table, self.bar, self.output_fn = history, table, bar, output_fn
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
        """Record the validation at ``iteration``; ``output_fn`` sees ``validation_<name>``."""
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
        if self.bar is not None:
            self.bar.update()
        if self.sinks:
            current = info() if info is not None else self.history.info()
            for sink in self.sinks:
                sink.update(current)

    def close(self, **fields) -> TrainingInfo:
        """Close the table, the sinks and ``output_fn``'s stream; the final ``TrainingInfo``."""
        info = self.history.info(**fields)
        if self.bar is not None:
            self.bar.close()
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
