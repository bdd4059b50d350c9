"""Optax solvers, gradient clipping and learning-rate schedules from ``TrainingOptions``.

The base learning rate, L2 factor, momentum, gradient threshold, epsilon, and the piecewise
schedule's drop factor and period are the solver's *hyperparameters*: values the training
program takes as arguments, so that runs differing only in them (a search's trials) share one
compiled program.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxflowers import schedules
from jaxflowers.options.training import TrainingOptions
from jaxflowers.training.layout import FlatParams
from jaxflowers.training.learn_rates import scale_updates

__all__ = ["HYPERPARAMETERS", "Solver", "hyperparameters", "learn_rate_schedule",
           "make_optimizer"]

# Each enters the float32 arithmetic where the constant it replaces did (XLA no longer folds a
# constant rate into the products around it). Adam's and RMSProp's decays stay constants:
# optax takes ``1 - decay``, which a constant rounds once from float64 and an argument twice.
HYPERPARAMETERS = ("learn_rate", "l2_regularization", "momentum", "gradient_threshold",
                   "epsilon", "learn_rate_drop_factor", "learn_rate_drop_period")


def hyperparameters(options: TrainingOptions) -> dict[str, np.ndarray]:
    """The options' ``HYPERPARAMETERS``, the training program's argument: float32 scalars,
    the drop factor as its 31 float32 powers (``schedules.drop_powers``), the period int32.

    Which of them the program uses is fixed by the options (the solver; an L2 factor or a
    momentum of 0, an infinite threshold, a schedule without "piecewise": none), so those
    choices still compile apart."""
    return {"learn_rate": np.float32(options.learn_rate),
            "l2_regularization": np.float32(options.l2_regularization),
            "momentum": np.float32(options.momentum),
            "gradient_threshold": np.float32(options.gradient_threshold),
            "epsilon": np.float32(options.epsilon),
            "learn_rate_drop_factor": schedules.drop_powers(options.learn_rate_drop_factor),
            "learn_rate_drop_period": np.int32(min(options.learn_rate_drop_period, 2**31 - 1))}


@dataclasses.dataclass(frozen=True)
class Solver:
    """``values -> (solver, schedule)``: ``make_optimizer`` and ``learn_rate_schedule`` of a
    training, with the hyperparameters from ``values`` (placed scalars, or tracers inside the
    program; None: the options' own)."""

    options: TrainingOptions
    steps_per_epoch: int
    layout: FlatParams | None = None
    factors: tuple[float, ...] | None = None

    def __call__(self, values=None) -> tuple[optax.GradientTransformation, optax.Schedule]:
        values = hyperparameters(self.options) if values is None else values
        return (make_optimizer(self.options, self.steps_per_epoch, self.layout, self.factors,
                               values=values),
                learn_rate_schedule(self.options, self.steps_per_epoch, values))


def learn_rate_schedule(options: TrainingOptions, steps_per_epoch: int,
                        values: dict | None = None) -> optax.Schedule:
    """The learning rate as an optax schedule of the 0-based iteration; ``values``: the
    ``HYPERPARAMETERS`` (default the options')."""
    values = hyperparameters(options) if values is None else values
    piecewise = schedules.Drops(values["learn_rate_drop_factor"],
                                values["learn_rate_drop_period"])
    return schedules.to_optax(options.learn_rate_schedule, values["learn_rate"],
                              steps_per_epoch, options.max_epochs * steps_per_epoch, piecewise)


def make_optimizer(options: TrainingOptions, steps_per_epoch: int,
                   layout: FlatParams | None = None,
                   factors: Sequence[float] | None = None,
                   values: dict | None = None) -> optax.GradientTransformation:
    """The solver with L2 regularisation, gradient clipping and the learning-rate schedule.

    ``layout`` is the flat vector's ``FlatParams`` (for the "l2norm" clip), or None for a tree;
    ``factors`` (per parameter leaf, ``learn_rates.factors``) multiply the solver's update
    last (``setLearnRateFactor``); ``values``: the ``HYPERPARAMETERS`` (default the options')."""
    values = hyperparameters(options) if values is None else values
    schedule = learn_rate_schedule(options, steps_per_epoch, values)
    if options.solver == "sgdm":
        solver = optax.sgd(schedule, momentum=values["momentum"] if options.momentum else None)
    elif options.solver == "rmsprop":
        # MATLAB divides by sqrt(v) + epsilon, optax by default by sqrt(v + epsilon).
        solver = optax.rmsprop(schedule, decay=options.squared_decay, eps=values["epsilon"],
                               eps_in_sqrt=False)
    else:
        solver = optax.adam(schedule, b1=options.gradient_decay_factor,
                            b2=options.squared_decay, eps=values["epsilon"])
    chain = []  # L2 coupled to the gradient before clipping, as MATLAB's L2Regularization
    if options.l2_regularization:
        chain.append(optax.add_decayed_weights(values["l2_regularization"]))
        if factors is not None and 0.0 in factors:
            # Frozen parameters' weight decay would count in a gradient norm and the
            # solver's moments: zero it (their gradient is zero already).
            chain.append(scale_updates([0.0 if f == 0.0 else 1.0 for f in factors], layout))
    if not math.isinf(options.gradient_threshold):
        chain.append(_clip(options.gradient_threshold_method, values["gradient_threshold"],
                           layout))
    if factors is not None:
        return optax.chain(*chain, solver, scale_updates(factors, layout))
    return optax.chain(*chain, solver) if chain else solver


def _clip(method: str, threshold, layout: FlatParams | None
          ) -> optax.GradientTransformation:
    """MATLAB's ``GradientThresholdMethod`` ("l2norm": per parameter tensor)."""
    if method == "global-l2norm":
        return optax.clip_by_global_norm(threshold)
    if method == "absolute-value":
        return optax.clip(threshold)

    def per_tensor(updates, params=None):
        del params
        flat = layout
        if flat is None:
            return jax.tree.map(
                lambda g: g * _shrink(jnp.sqrt(jnp.sum(jnp.square(g))), threshold), updates)
        squares = jnp.square(updates)
        bounds = list(zip(flat.offsets[:-1], flat.offsets[1:]))
        norms = jnp.sqrt(jnp.stack([squares[a:b].sum() for a, b in bounds]))
        factors = _shrink(norms, threshold)
        # One factor per element, built from static slices: no index vector in the program.
        return updates * jnp.concatenate([jnp.broadcast_to(factors[i], (b - a,))
                                          for i, (a, b) in enumerate(bounds)])

    return optax.stateless(per_tensor)


def _shrink(norm, threshold):
    """``min(1, threshold / norm)``: 1 for a zero norm."""
    return jnp.minimum(1.0, threshold / jnp.maximum(norm, 1e-30))
