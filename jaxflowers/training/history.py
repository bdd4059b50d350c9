"""``History``: the per-iteration record of one training, from which ``TrainingInfo`` is made.

Kept apart from what shows it, so a checkpoint can store it. No JAX."""
from __future__ import annotations

import copy

import numpy as np

from jaxflowers.training.info import TrainingInfo

__all__ = ["History"]

_ITERATION_FIELDS = ("loss", "accuracy", "learn_rate")
_VALIDATION_FIELDS = ("iteration", "loss", "accuracy")


class History:
    """Mini-batch metrics of every iteration run and the validations, in MATLAB's units.

    ``metrics`` names the validation metrics recorded besides loss and accuracy;
    ``max_epochs``, the epochs planned, is not stored (a resumed run may change it)."""

    def __init__(self, steps_per_epoch: int, metrics=(), max_epochs: int | None = None):
        self.steps_per_epoch, self.max_epochs = steps_per_epoch, max_epochs
        self.metrics = tuple(m for m in metrics if m != "accuracy")
        self.rows: dict[str, list[float]] = {k: [] for k in _ITERATION_FIELDS}
        self.validations: dict[str, list] = {k: [] for k in (*_VALIDATION_FIELDS,
                                                             *self.metrics)}

    @property
    def iterations_done(self) -> int:
        return len(self.rows["loss"])

    def epoch(self, iteration: int) -> int:
        """The 1-based epoch of a 1-based iteration (0 for iteration 0)."""
        return (iteration - 1) // self.steps_per_epoch + 1 if iteration else 0

    def add(self, loss, accuracy, learn_rate) -> range:
        """Append consecutive iterations (accuracy as a fraction); returns their numbers."""
        first = self.iterations_done + 1
        for key, values in (("loss", loss), ("accuracy", 100.0 * np.asarray(accuracy)),
                            ("learn_rate", learn_rate)):
            self.rows[key].extend(np.asarray(values, dtype=np.float64).tolist())
        return range(first, self.iterations_done + 1)

    def add_validation(self, iteration: int, scores: dict) -> None:
        """Record ``metrics.score``'s scores of the validation at ``iteration``."""
        self.validations["iteration"].append(int(iteration))
        for key in self.validations.keys() - {"iteration"}:
            self.validations[key].append(float(scores[key]))

    def row(self, iteration: int) -> dict:
        """Iteration, epoch and mini-batch metrics of one recorded iteration."""
        values = {k: v[iteration - 1] for k, v in self.rows.items()}
        return {"iteration": iteration, "epoch": self.epoch(iteration), **values}

    def validation_at(self, iteration: int) -> dict | None:
        """The scores of the validation at ``iteration``, or None."""
        return next((scores for it, scores in self.validation_scores() if it == iteration),
                    None)

    def validation_scores(self) -> list[tuple[int, dict]]:
        """``(iteration, scores)`` of every validation, in order."""
        names = [k for k in self.validations if k != "iteration"]
        return [(it, {k: self.validations[k][i] for k in names})
                for i, it in enumerate(self.validations["iteration"])]

    def info(self, **fields) -> TrainingInfo:
        """The record as a ``TrainingInfo``; ``fields`` fill its other attributes."""
        iters = np.arange(1, self.iterations_done + 1)
        return TrainingInfo(
            iteration=iters, epoch=(iters - 1) // self.steps_per_epoch + 1,
            loss=np.asarray(self.rows["loss"]), accuracy=np.asarray(self.rows["accuracy"]),
            learn_rate=np.asarray(self.rows["learn_rate"]),
            validation_iteration=np.asarray(self.validations["iteration"], dtype=np.int64),
            validation_loss=np.asarray(self.validations["loss"], dtype=np.float64),
            validation_accuracy=np.asarray(self.validations["accuracy"], dtype=np.float64),
            validation_metrics={k: np.asarray(self.validations[k], dtype=np.float64)
                                for k in self.metrics},
            **{"max_epochs": self.max_epochs, "iterations_per_epoch": self.steps_per_epoch,
               **fields})

    def to_json(self) -> dict:
        """The record as JSON-able lists (what a checkpoint stores): copies, since a
        checkpoint is written in a thread while training appends to the record."""
        return {"steps_per_epoch": self.steps_per_epoch, "metrics": list(self.metrics),
                "rows": copy.deepcopy(self.rows), "validations": copy.deepcopy(self.validations)}

    @classmethod
    def from_json(cls, record: dict) -> "History":
        """The ``History`` that ``to_json`` described."""
        history = cls(int(record["steps_per_epoch"]), record.get("metrics", ()))
        history.rows = {k: [float(v) for v in record["rows"][k]] for k in _ITERATION_FIELDS}
        history.validations = {k: list(record["validations"][k]) for k in history.validations}
        return history
