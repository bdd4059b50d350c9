"""The objective metric: which validation is best so far, and when patience runs out.

MATLAB's ``ValidationPatience``: training stops once the objective (``ObjectiveMetricName``,
the validation loss by default) has failed to improve on its best value this many
validations in a row; a tie is no improvement. ``OutputNetwork="best-validation"`` returns
the network of the best validation (the first one, among equals). The state is a function
of the validation history alone, so a resumed run rebuilds it exactly (:meth:`replay`).
"""
from __future__ import annotations

import math

from jaxflowers.inference.metrics import MAXIMISED


class Objective:
    """Tracks the best validation by one metric and the validations since it.

    Args:
      name: "loss" (minimised) or a metric (maximised), as ``metrics.score`` names it.
      patience: validations without improvement that stop training (``math.inf``: never).
    """

    def __init__(self, name: str, patience: float = math.inf):
        self.name, self.patience = name, patience
        self.maximise = MAXIMISED[name]
        self.best_value: float | None = None
        self.best_iteration: int | None = None
        self.waited = 0  # validations since the best

    def update(self, iteration: int, scores: dict) -> bool:
        """Take the validation at ``iteration``; returns whether it is the new best."""
        value = float(scores[self.name])
        better = not math.isnan(value) and (
            self.best_value is None or (value > self.best_value if self.maximise
                                        else value < self.best_value))
        if better:
            self.best_value, self.best_iteration, self.waited = value, iteration, 0
        else:
            self.waited += 1
        return better

    @property
    def exhausted(self) -> bool:
        """Whether patience has run out (training stops)."""
        return self.waited >= self.patience

    @classmethod
    def replay(cls, name: str, patience: float, validations) -> "Objective":
        """The state after the validations of a history, in order: ``(iteration, scores)``
        pairs (``History.validation_scores``)."""
        objective = cls(name, patience)
        for iteration, scores in validations:
            objective.update(iteration, scores)
        return objective
