"""argparse types on ``options.validate``: the parser refuses a bad flag in one line naming it,
before anything starts (a worker, JAX, a download)."""
from __future__ import annotations

import argparse
import math

from jaxflowers.options import validate

__all__ = ["image_size", "integer", "non_negative_int", "number", "positive_float", "positive_int",
           "positive_int_or_auto"]


def integer(minimum: int = 1, maximum: int | None = None):
    """An argparse type: an integer in ``[minimum, maximum]``."""
    def parse(text: str) -> int:
        try:
            return validate.integer(int(text), "value", minimum=minimum, maximum=maximum)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    what = ("a positive integer" if (minimum, maximum) == (1, None) else
            f"an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else ""))
    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def number(low: float = 0.0, high: float = math.inf, *, low_open: bool = True,
           high_open: bool = True):
    """An argparse type: a finite number in the interval given (default: > 0)."""
    def parse(text: str) -> float:
        try:
            return validate.number(float(text), "value", low=low, high=high, low_open=low_open,
                                   high_open=high_open)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    what = ("a positive number" if (low, high, low_open) == (0.0, math.inf, True)
            else f"a number in {interval}")
    parse.__name__ = "number"
    return parse


def image_size(text: str) -> tuple[int, int]:
    """An argparse type: ``N`` (square) or ``HxW`` pixels."""
    parts = text.lower().split("x")
    try:
        size = tuple(validate.integer(int(p), "size", minimum=1) for p in parts)
    except ValueError:
        size = ()
    if len(size) not in (1, 2):
        raise argparse.ArgumentTypeError(f"{text!r} is not an image size: N or HxW pixels, "
                                         "e.g. 224 or 160x240")
    return size * 2 if len(size) == 1 else size


def positive_int_or_auto(text: str) -> int | str:
    """An argparse type: a positive integer, or "auto"."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer or auto") from None


positive_int = integer(1)
non_negative_int = integer(0)
positive_float = number()
