"""Checks of option values; each raises ``ValueError`` naming the option, the value and what
is allowed. The ``check_*`` forms check a dataclass field; ``cli.args`` builds on the others.
"""
from __future__ import annotations

import math
import numbers

__all__ = ["boolean", "check_bool", "check_choice", "check_float", "check_int", "choice", "integer",
           "number"]


def integer(value, name: str, *, minimum: int | None = None, maximum: int | None = None,
            optional: bool = False):
    """``value`` if it is an integer in ``[minimum, maximum]`` (or None when ``optional``)."""
    if optional and value is None:
        return value
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
        bounds = " and ".join(filter(None, (minimum is not None and f">= {minimum}",
                                            maximum is not None and f"<= {maximum}")))
        raise ValueError(f"{name}={value!r} must be an integer{' ' + bounds if bounds else ''}"
                         + (" or None" if optional else ""))
    return int(value)


def number(value, name: str, *, low: float = -math.inf, high: float = math.inf,
           low_open: bool = False, high_open: bool = False) -> float:
    """``value`` if it is a finite number in the interval given."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    ok = ok and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name}={value!r} must be a finite number in {interval}")
    return float(value)


def choice(value, name: str, allowed) -> str:
    """``value`` if it is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; use one of {', '.join(allowed)}")
    return value


def boolean(value, name: str) -> bool:
    """``value`` if it is True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False")
    return value


def check_choice(owner, name: str, allowed: tuple[str, ...]) -> None:
    choice(getattr(owner, name), name, allowed)


def check_int(owner, name: str, *, minimum: int, maximum: int | None = None,
              optional: bool = False) -> None:
    integer(getattr(owner, name), name, minimum=minimum, maximum=maximum, optional=optional)


def check_float(owner, name: str, **interval) -> None:
    number(getattr(owner, name), name, **interval)


def check_bool(owner, name: str) -> None:
    boolean(getattr(owner, name), name)
