"""Early stopping and the returned network (``ValidationPatience``, ``ObjectiveMetricName``,
``OutputNetwork``). Its state is a function of the validation history, so a resumed run replays
it exactly; the best network itself travels in the checkpoint.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import jax
import numpy as np

from jaxflowers.inference import metrics
from jaxflowers.inference.metrics import MAXIMISED
from jaxflowers.options.training import TrainingOptions
from jaxflowers.training.history import History
from jaxflowers.training.stop import StopReason

__all__ = ["EarlyStopping", "Objective", "Output", "keeps_networks", "returned_network"]


class Objective:
    """The best validation by one metric, and the validations since it (a tie is no better).

    Args:
      name: "loss" (minimised) or a metric (maximised), as ``metrics.score`` names it.
      patience: validations without improvement that stop training (``math.inf``: never).
    """

    def __init__(self, name: str, patience: float = math.inf):
        self.name, self.patience = name, patience
        self.maximise = MAXIMISED[name]
        self.best_value: float | None = None
        self.best_iteration: int | None = None
        self.waited = 0

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
        return self.waited >= self.patience

    @classmethod
    def replay(cls, name: str, patience: float, validations) -> "Objective":
        """The state after ``(iteration, scores)`` validations (``History.validation_scores``)."""
        objective = cls(name, patience)
        for iteration, scores in validations:
            objective.update(iteration, scores)
        return objective


def keeps_networks(options: TrainingOptions) -> bool:
    """Whether validated networks are kept on the devices ("best-validation", or patience)."""
    # why for patience: the devices may have run past the stop by the time it is decided
    return options.validation_data is not None and (
        options.best_validation or not math.isinf(options.validation_patience))


class EarlyStopping:
    """Judges one run's validations and keeps the networks it may return (``best``, ``latest``).

    ``history`` (a resumed run's) is replayed; ``best`` is ``(iteration, placed variables)``."""

    def __init__(self, options: TrainingOptions, history: History, best=None):
        self.options = options
        self.objective = Objective.replay(options.objective_metric_name,
                                          options.validation_patience,
                                          history.validation_scores())
        self.best, self.latest = best, None

    @property
    def exhausted(self) -> bool:
        return self.objective.exhausted

    def judge(self, iteration: int, scores: dict, variables) -> bool:
        """Take the validation of ``variables`` (a device copy); whether patience ran out."""
        if self.objective.update(iteration, scores):
            self.best = (iteration, variables)
        if not math.isinf(self.objective.patience):  # a patience stop returns this one
            self.latest = (iteration, variables)
        return self.objective.exhausted

    def best_so_far(self, snapshot: dict) -> dict:
        """The variables a checkpoint keeps as the best network (before validating: its own)."""
        if self.best is not None:
            return self.best[1]
        return {"params": snapshot["params"], "batch_stats": snapshot["batch_stats"]}

    def chosen(self, stopped_by: StopReason | None):
        """``(iteration, placed variables)`` of the network to return; None: the last one."""
        if self.options.best_validation and self.best is not None:
            return self.best
        if stopped_by is StopReason.PATIENCE and self.latest is not None:
            return self.latest
        return None


@dataclasses.dataclass
class Output:
    """The returned network: iteration, host variables in tree form, final validation scores."""

    iteration: int
    variables: dict
    scores: dict

    def info_fields(self, names) -> dict:
        """``TrainingInfo`` fields describing it."""
        return {"output_network_iteration": self.iteration,
                "final_validation_loss": self.scores.get("loss"),
                "final_validation_accuracy": self.scores.get("accuracy"),
                "final_validation_metrics": {k: self.scores[k] for k in names
                                             if k != "accuracy" and k in self.scores}}


def returned_network(program, ready, chosen, stopped_by: StopReason | None, state,
                     history: History) -> Output:
    """The network to return (``chosen``, or the last), with population statistics and scores."""
    parallel = program.parallel
    iteration = chosen[0] if chosen else int(parallel.get(state.step))
    if chosen is None and ready.population is None and ready.validation is None:
        return Output(iteration, program.host_variables(state), {})
    variables = chosen[1] if chosen else program.variables(state)
    # A diverged run's last finite network keeps its statistics: population ones would overflow.
    last_finite = chosen is None and stopped_by is not None and stopped_by.diverged
    recomputed = (ready.population is not None and not last_finite
                  and _population(ready, variables))
    if recomputed:
        variables = recomputed
    scores = {}
    if ready.validation is not None:
        scores = None if recomputed else history.validation_at(iteration)
        if scores is None:
            placed, labels, stats = ready.validation
            logits = program.forward.logits(variables, placed, stats)
            scores = metrics.score(logits, labels, program.options.metrics)
    return Output(iteration, parallel.get(variables), scores)


def _population(ready, variables):
    """``variables`` with population statistics, or None (and a warning) when not finite."""
    updated = ready.population(variables)
    if all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(jax.device_get(
            updated["batch_stats"]))):
        return updated
    warnings.warn("population batch-norm statistics overflow float32 for this network; it "
                  "keeps the statistics it trained with (batch_normalization_statistics="
                  '"moving")', RuntimeWarning, stacklevel=3)
    return None
