"""What an experiment's parameters range over: lists of values (a grid's axes) and
distributions (random and Bayesian search), and their command-line form.

``{"depth": [1, 2, 3], "initial_learn_rate": loguniform(1e-3, 1e-1)}`` in Python is
``--param depth=1,2,3 --param initial_learn_rate=loguniform:1e-3:1e-1`` on the command
line. Each kind can draw a value from a numpy generator (random search), ask an Optuna
trial for one (``suggest``: what the study records, and Bayesian search) and name the
values a check must try. Imports no Optuna.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
from typing import Any, Mapping, Sequence

__all__ = ["Integers", "ParameterError", "Uniform", "Values", "as_parameter", "describe", "grid",
           "integers", "loguniform", "parse", "random_points", "uniform"]


class ParameterError(ValueError):
    """A parameter of an experiment is unknown, empty, out of order or of the wrong type."""


@dataclasses.dataclass(frozen=True)
class Values:
    """A list of values, tried in order by a grid and drawn evenly by random search."""

    values: tuple

    kind = "values"

    def check(self, name: str) -> None:
        """Raise ``ParameterError`` naming ``name`` when the list is empty or holds values
        a study cannot record (anything but numbers, strings, booleans and None)."""
        if not self.values:
            raise ParameterError(f"parameter {name!r} has an empty list of values")
        odd = [v for v in self.values if v is not None and not isinstance(v, (bool, int, float,
                                                                             str))]
        if odd:
            raise ParameterError(f"parameter {name!r}: {odd[0]!r} is not a number, string, "
                                 "boolean or None (a fixed setting of another kind goes in "
                                 "options=)")

    def draw(self, rng) -> Any:
        return self.values[int(rng.integers(len(self.values)))]

    def extremes(self) -> tuple:
        return self.values

    def suggest(self, trial, name: str) -> Any:
        return trial.suggest_categorical(name, list(self.values))

    def __str__(self) -> str:
        return ",".join(json.dumps(v) if not isinstance(v, str) else v for v in self.values)


@dataclasses.dataclass(frozen=True)
class Uniform:
    """Real numbers from ``low`` to ``high``, evenly (``log``: evenly in their logarithm)."""

    low: float
    high: float
    log: bool = False

    @property
    def kind(self) -> str:
        return "loguniform" if self.log else "uniform"

    def check(self, name: str) -> None:
        """Raise ``ParameterError`` naming ``name`` for bounds that are not numbers, out of
        order, or not positive on a log scale."""
        _check_bounds(self, name, (int, float))

    def draw(self, rng) -> float:
        if self.log:
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return float(rng.uniform(self.low, self.high))

    def extremes(self) -> tuple:
        return (float(self.low), float(self.high))

    def suggest(self, trial, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high, log=self.log)

    def __str__(self) -> str:
        return f"{self.kind}:{self.low!r}:{self.high!r}"


@dataclasses.dataclass(frozen=True)
class Integers:
    """Integers from ``low`` to ``high``, both included (``log``: evenly in their logarithm)."""

    low: int
    high: int
    log: bool = False

    @property
    def kind(self) -> str:
        return "logint" if self.log else "int"

    def check(self, name: str) -> None:
        """As ``Uniform.check``, for integer bounds."""
        _check_bounds(self, name, (int,))

    def draw(self, rng) -> int:
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high + 1)))
            return int(min(self.high, math.floor(value)))
        return int(rng.integers(self.low, self.high + 1))

    def extremes(self) -> tuple:
        return (int(self.low), int(self.high))

    def suggest(self, trial, name: str) -> int:
        return trial.suggest_int(name, self.low, self.high, log=self.log)

    def __str__(self) -> str:
        return f"{self.kind}:{self.low}:{self.high}"


Parameter = Values | Uniform | Integers
_KINDS = {"uniform": (Uniform, float, False), "loguniform": (Uniform, float, True),
          "int": (Integers, int, False), "logint": (Integers, int, True)}


def uniform(low: float, high: float) -> Uniform:
    """Real values between ``low`` and ``high``, drawn evenly (Experiment Manager's "uniform")."""
    return Uniform(low, high)


def loguniform(low: float, high: float) -> Uniform:
    """Positive values between ``low`` and ``high``, even in their logarithm (learning rates,
    L2 factors; Experiment Manager's "log-uniform")."""
    return Uniform(low, high, log=True)


def integers(low: int, high: int, *, log: bool = False) -> Integers:
    """Integers from ``low`` to ``high``, both included."""
    return Integers(low, high, log=log)


def as_parameter(name: str, spec) -> Parameter:
    """The parameter ``spec`` stands for: a list or tuple of values, or a distribution.

    Raises:
      ParameterError: naming ``name``, for anything else, an empty list or bad bounds.
    """
    if isinstance(spec, (Values, Uniform, Integers)):
        parameter = spec
    elif isinstance(spec, (list, tuple, range)):
        parameter = Values(tuple(spec))
    else:
        raise ParameterError(f"parameter {name!r}: {spec!r} is neither a list of values nor a "
                             "distribution (uniform, loguniform, integers); a setting that "
                             "stays fixed goes in options=")
    parameter.check(name)
    return parameter


def parse(item: str) -> tuple[str, Parameter]:
    """One ``--param`` item: ``NAME=V1,V2,...`` or ``NAME=KIND:LOW:HIGH`` (``KIND``:
    uniform, loguniform, int, logint). Values are read as JSON (``1``, ``1e-3``, ``true``),
    else kept as strings (``sgdm``, a folder).

    Raises:
      ParameterError: naming the item when it does not parse.
    """
    name, sep, text = item.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ParameterError(f"--param {item!r}: use NAME=V1,V2,... or NAME=KIND:LOW:HIGH")
    kind, _, bounds = text.partition(":")
    if kind in _KINDS:
        cls, number, log = _KINDS[kind]
        parts = [_value(part) for part in bounds.split(":")]
        if len(parts) != 2 or not all(_is_number(v, integer=number is int) for v in parts):
            raise ParameterError(f"--param {item!r}: {kind} takes two {number.__name__} "
                                 f"bounds, e.g. {name}={kind}:1:10")
        return name, as_parameter(name, cls(number(parts[0]), number(parts[1]), log=log))
    values = [_value(part) for part in text.split(",")] if text else []
    return name, as_parameter(name, values)


def grid(space: Mapping[str, Parameter]) -> list[dict]:
    """Every combination of the lists of ``space``, the last name varying fastest.

    Raises:
      ParameterError: naming a parameter that is a distribution (a grid takes lists).
    """
    for name, parameter in space.items():
        if not isinstance(parameter, Values):
            raise ParameterError(f"parameter {name!r} is a distribution ({parameter}); a grid "
                                 "takes lists of values (or use strategy random or bayesian)")
    names = list(space)
    return [dict(zip(names, combination))
            for combination in itertools.product(*(space[n].values for n in names))]


def random_points(space: Mapping[str, Parameter], count: int, seed: int) -> list[dict]:
    """``count`` points drawn from ``space``; point ``i`` depends only on ``seed`` and ``i``,
    so a resumed experiment draws again exactly the points it had not finished."""
    import numpy as np

    return [{name: parameter.draw(np.random.default_rng([seed, index, position]))
             for position, (name, parameter) in enumerate(space.items())}
            for index in range(count)]


def describe(space: Mapping[str, Parameter]) -> dict[str, str]:
    """Each parameter in its command-line form (what a study records as its definition)."""
    return {name: str(parameter) for name, parameter in space.items()}


def _check_bounds(parameter, name: str, types: Sequence[type]) -> None:
    low, high = parameter.low, parameter.high
    what = "integers" if types == (int,) else "numbers"
    if any(isinstance(v, bool) or not isinstance(v, tuple(types)) or not math.isfinite(v)
           for v in (low, high)):
        raise ParameterError(f"parameter {name!r}: {parameter.kind} bounds {low!r}, {high!r} "
                             f"must be finite {what}")
    if low > high:
        raise ParameterError(f"parameter {name!r}: {parameter.kind} low {low!r} is above "
                             f"high {high!r}")
    if parameter.log and low <= 0:
        raise ParameterError(f"parameter {name!r}: {parameter.kind} needs positive bounds, "
                             f"not low {low!r}")


def _is_number(value, *, integer: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return float(value).is_integer() if integer else True


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text.strip()
