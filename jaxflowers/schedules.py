"""Learning-rate schedules (MATLAB's ``piecewiseLearnRate``, ``warmupLearnRate``, ...) for optax.

``learn_rate_schedule`` takes one, MATLAB's name of one, or a sequence run one after the other.
Each scales the base rate by a factor of ``k``, its steps (iterations or epochs) since it took
over; a ``None`` length runs to the end of training.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from jaxflowers.options.validate import check_choice, check_float, check_int

__all__ = ["Constant", "Cosine", "Cyclical", "Drops", "Exponential", "NAMES", "Piecewise",
           "Polynomial", "Schedule", "UNITS", "Warmup", "check", "drop_powers", "drops",
           "from_plain", "parts", "spans_training", "to_optax", "to_plain"]

UNITS = ("epoch", "iteration")
NAMES = ("none", "piecewise", "warmup", "cosine", "polynomial", "exponential", "cyclical")


class Schedule:
    """A learning-rate schedule: ``factor(steps)`` multiplies the base rate."""

    frequency_unit: str

    def length(self, remaining: int) -> float:
        """Steps it runs of the ``remaining`` ones before the next takes over (inf: all)."""
        return math.inf

    def factor(self, remaining: int) -> Callable:
        """The factor as an optax schedule of ``k`` (steps of this schedule completed)."""
        raise NotImplementedError

    def _check_unit(self) -> None:
        check_choice(self, "frequency_unit", UNITS)


@dataclasses.dataclass(frozen=True)
class Constant(Schedule):
    """The base rate throughout ("none")."""

    frequency_unit: str = "iteration"

    def factor(self, remaining: int) -> Callable:
        import optax

        return optax.constant_schedule(1.0)


@dataclasses.dataclass(frozen=True)
class Piecewise(Schedule):
    """``piecewiseLearnRate``: factor ``drop_factor ** floor(k / period)``."""

    drop_factor: float = 0.1  # in [0, 1]
    period: int = 10  # steps between drops
    frequency_unit: str = "epoch"

    def __post_init__(self):
        check_float(self, "drop_factor", low=0, high=1)
        check_int(self, "period", minimum=1)
        self._check_unit()

    def factor(self, remaining: int) -> Callable:
        return drops(drop_powers(self.drop_factor), self.period)


_BITS = 31  # of a non-negative int32 drop count


def drop_powers(drop_factor: float) -> np.ndarray:
    """``drop_factor ** 2 ** i`` for i < 31, each rounded to float32 once (0 once it
    underflows): what :func:`drops` multiplies in."""
    base = np.float64(np.float32(drop_factor))
    powers = np.zeros(_BITS, np.float32)
    for bit in range(_BITS):
        powers[bit] = np.float32(base ** 2 ** bit)
        if powers[bit] == 0:
            break
    return powers


def drops(powers, period) -> Callable:
    """``k -> drop_factor ** (k // period)`` in float32 from the factor's
    :func:`drop_powers` (constants, or arguments of a program so that runs with other
    factors and periods share it), with no constant of the training's length.

    The powers multiply in for the exponent's set bits, lowest first. Up to three drops
    this is the product taken one drop at a time (optax's ``piecewise_constant_schedule``),
    bit for bit; after more, it is within 3 units in the last place of the exact power,
    closer than one drop at a time. A factor of 1 multiplies by 1, of 0 by 0: exact."""
    import jax.numpy as jnp
    from jax import lax

    bits = np.arange(_BITS, dtype=np.int32)

    def factor(k):
        n = jnp.asarray(k, jnp.int32) // period
        # The powers of the set bits, 1 for the others (a product by 1 is exact), as one
        # vector split once: a few operations to trace whatever the number of bits.
        chosen = jnp.where((n >> bits) & 1 == 1, jnp.asarray(powers, jnp.float32), 1)
        value = jnp.ones((1,), jnp.float32)
        for power in lax.split(chosen, [1] * _BITS):
            value = value * power
        return value[0]

    return factor


@dataclasses.dataclass(frozen=True, eq=False)  # arrays or tracers: compared by identity
class Drops(Schedule):
    """:class:`Piecewise` from its :func:`drop_powers` and period as they are, unchecked: the
    options' "piecewise" inside a training program, whose values are its arguments."""

    powers: Any
    period: Any
    frequency_unit: str = "epoch"

    def factor(self, remaining: int) -> Callable:
        return drops(self.powers, self.period)


@dataclasses.dataclass(frozen=True)
class Warmup(Schedule):
    """``warmupLearnRate``: factor linear from ``initial_factor`` to ``final_factor`` in
    ``num_steps``, then the next schedule (or ``final_factor``)."""

    initial_factor: float = 0.0
    final_factor: float = 1.0
    num_steps: int = 5
    frequency_unit: str = "iteration"

    def __post_init__(self):
        check_float(self, "initial_factor", low=0)
        check_float(self, "final_factor", low=0)
        check_int(self, "num_steps", minimum=1)
        self._check_unit()

    def length(self, remaining: int) -> float:
        return self.num_steps

    def factor(self, remaining: int) -> Callable:
        import optax

        return optax.linear_schedule(self.initial_factor, self.final_factor, self.num_steps)


@dataclasses.dataclass(frozen=True)
class Polynomial(Schedule):
    """``polynomialLearnRate``: ``final + (initial - final) * (1 - k / num_steps) ** power``."""

    initial_factor: float = 1.0
    final_factor: float = 0.0
    power: float = 1.0
    num_steps: int | None = None  # None: to the end of training
    frequency_unit: str = "epoch"

    def __post_init__(self):
        check_float(self, "initial_factor", low=0)
        check_float(self, "final_factor", low=0)
        check_float(self, "power", low=0, low_open=True)
        check_int(self, "num_steps", minimum=1, optional=True)
        self._check_unit()

    def length(self, remaining: int) -> float:
        return math.inf if self.num_steps is None else self.num_steps

    def factor(self, remaining: int) -> Callable:
        import optax

        steps = self.num_steps or max(remaining, 1)
        return optax.polynomial_schedule(self.initial_factor, self.final_factor, self.power,
                                         steps)


@dataclasses.dataclass(frozen=True)
class Cosine(Schedule):
    """``cosineLearnRate``: ``final + (initial - final) * (1 + cos(pi * k / period)) / 2``,
    restarting with each period ``period_growth_factor`` times longer (inf: no restart)."""

    initial_factor: float = 1.0
    final_factor: float = 0.0
    period: int | None = None  # None: one period to the end of training
    period_growth_factor: float = 1.0
    frequency_unit: str = "epoch"

    def __post_init__(self):
        check_float(self, "initial_factor", low=0, low_open=True)
        check_float(self, "final_factor", low=0)
        check_int(self, "period", minimum=1, optional=True)
        growth = self.period_growth_factor
        if isinstance(growth, bool) or not isinstance(growth, (int, float)) or not growth >= 1:
            raise ValueError(f"period_growth_factor={growth!r} must be a number >= 1 (inf: "
                             "no restart)")
        self._check_unit()

    def factor(self, remaining: int) -> Callable:
        import optax

        period = self.period or max(remaining, 1)
        pieces, boundaries, start = [], [], 0
        while True:  # the periods that fit in training (at least one)
            pieces.append(optax.cosine_decay_schedule(
                self.initial_factor, period, alpha=self.final_factor / self.initial_factor))
            start += period
            period = period * self.period_growth_factor
            if start >= remaining or math.isinf(period):
                break
            boundaries.append(start)
            period = max(1, round(period))
        return optax.join_schedules(pieces, boundaries) if boundaries else pieces[0]


@dataclasses.dataclass(frozen=True)
class Exponential(Schedule):
    """``exponentialLearnRate``: factor ``drop_factor ** (k / period)``."""

    drop_factor: float = 0.1  # in (0, 1)
    period: int = 1
    frequency_unit: str = "epoch"

    def __post_init__(self):
        check_float(self, "drop_factor", low=0, high=1, low_open=True, high_open=True)
        check_int(self, "period", minimum=1)
        self._check_unit()

    def factor(self, remaining: int) -> Callable:
        import optax

        return optax.exponential_decay(1.0, self.period, self.drop_factor)


@dataclasses.dataclass(frozen=True)
class Cyclical(Schedule):
    """``cyclicalLearnRate``: each period, factor linear from 1 up to ``max_factor`` over
    ``step_ratio`` of it, then back to 1."""

    max_factor: float = 5.0
    period: int = 10
    step_ratio: float = 0.25  # in (0, 1)
    frequency_unit: str = "epoch"

    def __post_init__(self):
        check_float(self, "max_factor", low=0, low_open=True)
        check_int(self, "period", minimum=1)
        check_float(self, "step_ratio", low=0, high=1, low_open=True, high_open=True)
        self._check_unit()

    def factor(self, remaining: int) -> Callable:
        import jax.numpy as jnp

        knots = np.asarray([0.0, self.step_ratio * self.period, self.period], np.float32)
        values = np.asarray([1.0, self.max_factor, 1.0], np.float32)
        return lambda k: jnp.interp(jnp.mod(k, self.period).astype(jnp.float32), knots, values)


_DEFAULTS = {"none": Constant, "warmup": Warmup, "cosine": Cosine,
             "polynomial": Polynomial, "exponential": Exponential, "cyclical": Cyclical}


_CLASSES = {cls.__name__: cls for cls in (Constant, Piecewise, Warmup, Polynomial, Cosine,
                                          Exponential, Cyclical)}


def to_plain(spec):
    """A ``learn_rate_schedule`` value as JSON-able data (``{"schedule": class name, ...}``)."""
    if isinstance(spec, (tuple, list)):
        return [to_plain(item) for item in spec]
    if isinstance(spec, Schedule):
        return {"schedule": type(spec).__name__, **dataclasses.asdict(spec)}
    return spec


def from_plain(plain):
    """The ``learn_rate_schedule`` value of :func:`to_plain`'s data."""
    if isinstance(plain, list):
        return tuple(from_plain(item) for item in plain)
    if isinstance(plain, dict):
        fields = dict(plain)
        name = fields.pop("schedule", None)
        if name not in _CLASSES:
            raise ValueError(f"learn_rate_schedule: {name!r} is not a schedule; use one of "
                             f"{', '.join(_CLASSES)}")
        return _CLASSES[name](**fields)
    return plain


def parts(spec, piecewise: Piecewise) -> tuple[Schedule, ...]:
    """The schedules a ``learn_rate_schedule`` names, in order ("piecewise": ``piecewise``)."""
    items = spec if isinstance(spec, (tuple, list)) else (spec,)
    return tuple(piecewise if item == "piecewise" else _DEFAULTS[item]()
                 if isinstance(item, str) else item for item in items)


def check(spec) -> None:
    """Raise ``ValueError`` unless ``spec`` is a name, a ``Schedule`` or a sequence of them in
    which only the last runs to the end of training."""
    items = spec if isinstance(spec, (tuple, list)) else (spec,)
    allowed = (f"use one of {', '.join(NAMES)}, a jaxflowers.schedules object or a sequence "
               "of them")
    if not items:
        raise ValueError(f"learn_rate_schedule={spec!r} is empty; {allowed}")
    for item in items:
        if not (item in NAMES if isinstance(item, str) else isinstance(item, Schedule)):
            raise ValueError(f"learn_rate_schedule={spec!r}: {item!r} is not allowed; {allowed}")
    for item in items[:-1]:
        if parts(item, Piecewise())[0].length(1) == math.inf:
            raise ValueError(f"learn_rate_schedule={spec!r}: {item!r} runs to the end of "
                             "training, so what follows it would never run; put it last")


def spans_training(spec) -> bool:
    """Whether the schedule's shape depends on ``max_epochs`` (a "rest of training" length)."""
    return any(getattr(part, name, 0) is None for part in parts(spec, Piecewise())
               for name in ("num_steps", "period"))


def to_optax(spec, base: float, steps_per_epoch: int, total: int,
             piecewise: Piecewise) -> Callable:
    """The learning rate as an optax schedule of the 0-based iteration.

    ``spec`` is a checked ``learn_rate_schedule``, ``base`` the base rate, ``total`` the
    training's iterations, ``piecewise`` what "piecewise" stands for."""
    import optax

    pieces, boundaries, start = [], [], 0
    for part in parts(spec, piecewise):
        per_step = steps_per_epoch if part.frequency_unit == "epoch" else 1
        remaining = max(-(-(total - start) // per_step), 1)
        pieces.append(_in_iterations(part.factor(remaining), per_step, base))
        start += part.length(remaining) * per_step
        boundaries.append(start)
    return optax.join_schedules(pieces, boundaries[:-1]) if len(pieces) > 1 else pieces[0]


def _in_iterations(factor: Callable, per_step: int, base: float) -> Callable:
    """``base * factor(k)`` with ``k`` the completed steps of ``per_step`` iterations."""
    if per_step == 1:
        return lambda count: base * factor(count)
    return lambda count: base * factor(count // per_step)
