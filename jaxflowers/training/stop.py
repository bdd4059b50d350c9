"""Why a training ended (MATLAB's ``StopReason``): one enum, compared by identity."""
from __future__ import annotations

import enum
import math

__all__ = ["StopReason", "divergence_words"]


class StopReason(enum.Enum):
    """The kinds of end of a training run; the value is MATLAB's wording where it has one."""

    MAX_EPOCHS = "max epochs completed"
    PATIENCE = "met validation criterion"  # ValidationPatience ran out
    OUTPUT_FN = "stopped by output_fn"
    INTERRUPTED = "interrupted"  # SIGINT (Ctrl-C)
    TERMINATED = "terminated"  # SIGTERM (kill, a scheduler's time limit)
    DIVERGED = "diverged"  # a training loss or gradient that is not finite
    VALIDATION_DIVERGED = "validation diverged"  # a validation loss that is not finite
    CHECKPOINT_FAILED = "checkpoint failed"  # checkpoint_failure="stop" and a save failed

    @property
    def diverged(self) -> bool:
        """Whether the network stopped because its numbers were no longer finite."""
        return self in (StopReason.DIVERGED, StopReason.VALIDATION_DIVERGED)

    @property
    def by_signal(self) -> bool:
        return self in (StopReason.INTERRUPTED, StopReason.TERMINATED)

    @property
    def at_recorded_point(self) -> bool:
        """Whether training ended at a result the host read; later device work is not recorded."""
        return self in (StopReason.DIVERGED, StopReason.VALIDATION_DIVERGED,
                        StopReason.PATIENCE)


def divergence_words(loss: float, iteration: int, *, validation: bool = False) -> str:
    """MATLAB's "Training loss is NaN", with the iteration."""
    what = "validation loss" if validation else "training loss"
    if math.isnan(loss):
        return f"{what} is NaN at iteration {iteration}"
    if math.isinf(loss):
        return f"{what} is Inf at iteration {iteration}"
    return f"gradient is not finite at iteration {iteration}"
