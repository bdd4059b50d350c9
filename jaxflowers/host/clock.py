"""Durations as MATLAB's progress views show them."""
from __future__ import annotations

__all__ = ["hms"]


def hms(seconds: float) -> str:
    """``hh:mm:ss`` of a duration (whole seconds, rounded down; hours unbounded)."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
