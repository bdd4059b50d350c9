"""Optax solvers and learning-rate schedules from ``TrainingOptions``.

MATLAB states drop periods in epochs; optax counts optimizer steps. The conversion happens
here, once, from the number of iterations per epoch.
"""
from __future__ import annotations

import optax

from jaxflowers.options import TrainingOptions


def learn_rate_schedule(options: TrainingOptions, steps_per_epoch: int) -> optax.Schedule:
    """The learning rate as a function of the (0-based) iteration.

    "piecewise" multiplies the rate by ``learn_rate_drop_factor`` after every
    ``learn_rate_drop_period`` epochs, i.e. at iterations ``k * period * steps_per_epoch``.
    """
    if options.learn_rate_schedule == "none":
        return optax.constant_schedule(options.learn_rate)
    period = options.learn_rate_drop_period * steps_per_epoch
    drops = range(period, options.max_epochs * steps_per_epoch, period)
    return optax.piecewise_constant_schedule(
        options.learn_rate, {step: options.learn_rate_drop_factor for step in drops})


def make_optimizer(options: TrainingOptions, steps_per_epoch: int) -> optax.GradientTransformation:
    """The solver with L2 regularisation and the learning-rate schedule.

    L2 is added to the gradient before the solver (``add_decayed_weights``), as MATLAB's
    ``L2Regularization`` does for both sgdm and adam. Every transformation is elementwise,
    so it runs on a parameter tree or on one flat vector (``step.FlatParams``) alike.
    """
    schedule = learn_rate_schedule(options, steps_per_epoch)
    if options.solver == "sgdm":
        solver = optax.sgd(schedule, momentum=options.momentum or None)
    else:
        solver = optax.adam(schedule, b1=options.gradient_decay_factor,
                            b2=options.squared_gradient_decay_factor, eps=options.epsilon)
    if options.l2_regularization == 0:
        return solver
    return optax.chain(optax.add_decayed_weights(options.l2_regularization), solver)
