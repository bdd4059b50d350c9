"""Optax solvers, gradient clipping and learning-rate schedules from ``TrainingOptions``."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from jaxflowers import schedules
from jaxflowers.options.training import TrainingOptions
from jaxflowers.training.layout import FlatParams
from jaxflowers.training.learn_rates import scale_updates

__all__ = ["learn_rate_schedule", "make_optimizer"]


def learn_rate_schedule(options: TrainingOptions, steps_per_epoch: int) -> optax.Schedule:
    """The learning rate as an optax schedule of the 0-based iteration."""
    piecewise = schedules.Piecewise(options.learn_rate_drop_factor,
                                    options.learn_rate_drop_period)
    return schedules.to_optax(options.learn_rate_schedule, options.learn_rate, steps_per_epoch,
                              options.max_epochs * steps_per_epoch, piecewise)


def make_optimizer(options: TrainingOptions, steps_per_epoch: int,
                   layout: FlatParams | None = None,
                   factors: list[float] | None = None) -> optax.GradientTransformation:
    """The solver with L2 regularisation, gradient clipping and the learning-rate schedule.

    ``layout`` is the flat vector's ``FlatParams`` (for the "l2norm" clip), or None for a tree;
    ``factors`` (per parameter leaf, ``learn_rates.factors``) multiply the solver's update
    last (``setLearnRateFactor``)."""
    schedule = learn_rate_schedule(options, steps_per_epoch)
    if options.solver == "sgdm":
        solver = optax.sgd(schedule, momentum=options.momentum or None)
    elif options.solver == "rmsprop":
        # MATLAB divides by sqrt(v) + epsilon, optax by default by sqrt(v + epsilon).
        solver = optax.rmsprop(schedule, decay=options.squared_decay, eps=options.epsilon,
                               eps_in_sqrt=False)
    else:
        solver = optax.adam(schedule, b1=options.gradient_decay_factor,
                            b2=options.squared_decay, eps=options.epsilon)
    chain = []  # L2 coupled to the gradient before clipping, as MATLAB's L2Regularization
    if options.l2_regularization:
        chain.append(optax.add_decayed_weights(options.l2_regularization))
        if factors is not None and 0.0 in factors:
            # Frozen parameters' weight decay would count in a gradient norm and the
            # solver's moments: zero it (their gradient is zero already).
            chain.append(scale_updates([0.0 if f == 0.0 else 1.0 for f in factors], layout))
    if not math.isinf(options.gradient_threshold):
        chain.append(_clip(options.gradient_threshold_method, options.gradient_threshold,
                           layout))
    if factors is not None:
        return optax.chain(*chain, solver, scale_updates(factors, layout))
    return optax.chain(*chain, solver) if chain else solver


def _clip(method: str, threshold: float, layout: FlatParams | None
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


def _shrink(norm, threshold: float):
    """``min(1, threshold / norm)``: 1 for a zero norm."""
    return jnp.minimum(1.0, threshold / jnp.maximum(norm, 1e-30))
