"""Early stopping and the network ``train`` returns: MATLAB's ``ValidationPatience``,
``ObjectiveMetricName`` and ``OutputNetwork``, in one place.

The objective (the validation loss, or a metric, which is then maximised) is judged at
every validation; training stops once it has failed to beat its best value
``validation_patience`` validations in a row (a tie is no improvement).
"best-validation" returns the network of the best validation (the first among equals),
"last-iteration" the last one trained (after a patience stop: the one of the validation
that stopped training). Validations that may decide the returned network score a copy of
it made on the devices; ``EarlyStopping`` keeps the copies it may return and drops the
rest. Its state is a function of the validation history, so a resumed run rebuilds it
exactly (the best network itself travels in the checkpoint).

:func:`returned_network` then gives the chosen network population batch-norm statistics
(not a diverged run's last finite one: its statistics would overflow) and scores it.
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


class Objective:
    """The best validation by one metric, and the validations since it.

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
    """Whether validated networks are kept on the devices: for "best-validation", and for a
    patience stop (the devices may have run past it by the time it is decided)."""
    return options.validation_data is not None and (
        options.best_validation or not math.isinf(options.validation_patience))


class EarlyStopping:
    """Judges the validations of one run and keeps the networks it may return.

    Args:
      options: the run's; ``validation_patience``, ``objective_metric_name``,
        ``output_network``.
      history: the validations so far (a resumed run's), replayed.
      best: ``(iteration, placed variables)`` of a resumed run's best network, or None.

    Attributes:
      best, latest: ``(iteration, placed variables)`` of the best and of the latest
        validated network, or None.
    """

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
        """Take the validation at ``iteration`` of the network ``variables`` (a copy on the
        devices); returns whether patience has run out."""
        if self.objective.update(iteration, scores):
            self.best = (iteration, variables)
        if not math.isinf(self.objective.patience):  # a patience stop returns this one
            self.latest = (iteration, variables)
        return self.objective.exhausted

    def best_so_far(self, snapshot: dict) -> dict:
        """The variables a checkpoint keeps as the best network (before any validation:
        the checkpoint's own)."""
        if self.best is not None:
            return self.best[1]
        return {"params": snapshot["params"], "batch_stats": snapshot["batch_stats"]}

    def chosen(self, stopped_by: StopReason | None):
        """``(iteration, placed variables)`` of the network to return, or None for the last
        one trained."""
        if self.options.best_validation and self.best is not None:
            return self.best
        if stopped_by is StopReason.PATIENCE and self.latest is not None:
            return self.latest
        return None


@dataclasses.dataclass
class Output:
    """The returned network: its iteration, variables (host arrays, tree form), and its
    final validation scores (``metrics.score``'s; empty without validation data)."""

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
    """The network to return (``chosen``, or the last one), with population statistics if
    asked for, and its scores on the validation set."""
    parallel = program.parallel
    iteration = chosen[0] if chosen else int(parallel.get(state.step))
    if chosen is None and ready.population is None and ready.validation is None:
        return Output(iteration, program.host_variables(state), {})
    variables = chosen[1] if chosen else program.variables(state)
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
    """``variables`` with population statistics, or None (and a warning) when they are not
    finite: the activations of a network on its way to divergence overflow float32."""
    updated = ready.population(variables)
    if all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(jax.device_get(
            updated["batch_stats"]))):
        return updated
    warnings.warn("population batch-norm statistics overflow float32 for this network; it "
                  "keeps the statistics it trained with (batch_normalization_statistics="
                  '"moving")', RuntimeWarning, stacklevel=3)
    return None
