"""Checks for option fields: each raises ``ValueError`` naming the field, the value and what
is allowed, so a bad option fails where it is written rather than deep inside training."""
from __future__ import annotations

import math


def check_choice(owner, name: str, allowed: tuple[str, ...]) -> None:
    """``owner.name`` must be one of ``allowed``."""
    value = getattr(owner, name)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; use one of {', '.join(allowed)}")


def check_int(owner, name: str, *, minimum: int, optional: bool = False) -> None:
    """``owner.name`` must be an integer >= ``minimum`` (or None when ``optional``)."""
    value = getattr(owner, name)
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}"
                         + (" or None" if optional else ""))


def check_float(owner, name: str, *, low: float, high: float = math.inf,
                low_open: bool = False, high_open: bool = False) -> None:
    """``owner.name`` must be a finite number in the interval given."""
    value = getattr(owner, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    ok = ok and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name}={value!r} must be a finite number in {interval}")


def check_bool(owner, name: str) -> None:
    """``owner.name`` must be True or False."""
    value = getattr(owner, name)
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False")
