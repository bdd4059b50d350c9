"""The network ``train`` returns: which one (MATLAB's ``OutputNetwork``), its batch-norm
statistics (``BatchNormalizationStatistics``) and its scores on the validation set.

"best-validation" returns the network of the validation with the best objective metric
("auto" does when there are validation data), "last-iteration" the last one trained (after
a patience stop: the one of the validation that stopped training). "population" statistics
are then recomputed for that network (``population.py``; not for the last finite network of
a run that diverged), and the final validation scores are those of the network returned, as
``predict`` would give them.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import jax
import numpy as np

from jaxflowers.inference import metrics
from jaxflowers.training.history import History
from jaxflowers.training.info import is_divergence
from jaxflowers.training.loop import PATIENCE
from jaxflowers.training.objective import Objective
from jaxflowers.options.training import TrainingOptions


def objective(options: TrainingOptions, history: History) -> Objective | None:
    """The judge of the validations, rebuilt from ``history`` (a resumed run's), or None
    when nothing depends on it."""
    if not keeps_networks(options):
        return None
    return Objective.replay(options.objective_metric_name, options.validation_patience,
                            history.validation_scores())


def keeps_networks(options: TrainingOptions) -> bool:
    """Whether validated networks are kept on the devices: for "best-validation", and for a
    patience stop (the devices may have run past it by the time it is decided)."""
    return options.validation_data is not None and (
        options.best_validation or not math.isinf(options.validation_patience))


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


def finish(program, ready, loop, state, history: History) -> Output:
    """Choose the returned network, give it population statistics if asked, score it."""
    options, parallel = program.options, program.parallel
    chosen = None
    if options.best_validation and loop.best is not None:
        chosen = loop.best
    elif loop.stop_reason == PATIENCE and loop.latest is not None:
        chosen = loop.latest
    iteration = chosen[0] if chosen else int(parallel.get(state.step))
    if chosen is None and ready.population is None and ready.validation is None:
        return Output(iteration, program.host_variables(state), {})
    variables = chosen[1] if chosen else program.variables(state)
    # The last finite network of a diverged run is returned as it was: its statistics
    # would overflow.
    last_finite = chosen is None and is_divergence(loop.stop_reason)
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
            scores = metrics.score(logits, labels, options.metrics)
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
