"""``TrainingInfo``: what ``train`` measured, iteration by iteration (MATLAB's ``info``)."""
from __future__ import annotations

import dataclasses

import numpy as np

# Stop reasons that mean the network diverged (``TrainingInfo.diverged``).
DIVERGED_PREFIXES = ("training loss is", "gradient is")


@dataclasses.dataclass
class TrainingInfo:
    """What ``train`` measured (MATLAB's ``info``/``TrainingHistory``).

    Per-iteration arrays have one entry per iteration actually run (1-based ``iteration``);
    accuracies are in percent, as MATLAB reports them.
    """

    iteration: np.ndarray  # int (I,)
    epoch: np.ndarray  # int (I,)
    loss: np.ndarray  # float (I,), mini-batch cross-entropy
    accuracy: np.ndarray  # float (I,), mini-batch accuracy in %
    learn_rate: np.ndarray  # float (I,), the rate the solver used
    validation_iteration: np.ndarray  # int (V,)
    validation_loss: np.ndarray  # float (V,)
    validation_accuracy: np.ndarray  # float (V,), %
    compile_time: float = 0.0  # seconds spent compiling before the first step
    train_time: float = 0.0  # seconds of the training loop, validation included
    validation_time: float = 0.0  # seconds of that the host waited for validation results
    images_per_second: float = 0.0  # training images / (train_time - validation_time)
    num_devices: int = 1
    data_placement: str = "resident"  # "resident" (copied to the devices) or "stream"
    stopped_early: bool = False  # training ended before max_epochs (see stop_reason)
    stop_reason: str = "max epochs completed"  # why training ended (MATLAB: StopReason)
    checkpoint: str | None = None  # folder of the newest checkpoint written, if any

    @property
    def diverged(self) -> bool:
        """Whether training stopped on a loss or gradient that was not finite."""
        return self.stop_reason.startswith(DIVERGED_PREFIXES)

    @property
    def final_validation_loss(self) -> float | None:
        return float(self.validation_loss[-1]) if len(self.validation_loss) else None

    @property
    def final_validation_accuracy(self) -> float | None:
        return float(self.validation_accuracy[-1]) if len(self.validation_accuracy) else None
