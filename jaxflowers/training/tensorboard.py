"""Training metrics as TensorBoard scalars through tensorboardX (no TensorFlow), a sink of
``train`` when ``TrainingOptions(log_dir=...)`` is given."""
from __future__ import annotations

import os
import pathlib

import numpy as np

__all__ = ["TRAINING_TAGS", "VALIDATION_TAGS", "TensorBoardLog", "summary_writer"]

# Tag of each TrainingInfo field; the part before "/" is TensorBoard's section.
TRAINING_TAGS = {"loss": "training/loss", "accuracy": "training/accuracy",
                 "learn_rate": "training/learn_rate"}
VALIDATION_TAGS = {"validation_loss": "validation/loss",
                   "validation_accuracy": "validation/accuracy"}


def summary_writer(log_dir):
    """tensorboardX's ``SummaryWriter`` class, or ImportError saying what to install; ``train``
    asks before it compiles, so a missing package costs nothing."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError as error:
        raise ImportError(f"TrainingOptions(log_dir={os.fspath(log_dir)!r}) needs "
                          "tensorboardX: pip install \"jaxflowers[tensorboard]\"") from error
    return SummaryWriter


class TensorBoardLog:
    """Write each iteration's metrics (``TRAINING_TAGS``, ``VALIDATION_TAGS``) to ``log_dir``.

    Needs ``pip install "jaxflowers[tensorboard]"``; ``flush_secs`` is the most seconds
    between two writes to disk.
    """

    def __init__(self, log_dir, *, flush_secs: int = 10):
        SummaryWriter = summary_writer(log_dir)
        self.log_dir = pathlib.Path(os.fspath(log_dir))
        self._writer = SummaryWriter(logdir=str(self.log_dir), flush_secs=flush_secs)
        self._iterations = self._validations = 0  # how many of each are written

    def update(self, info) -> None:
        """Write the iterations and validations of a ``TrainingInfo`` not yet written."""
        steps = np.asarray(info.iteration)
        for tags, start, steps_of in ((TRAINING_TAGS, self._iterations, steps),
                                      (VALIDATION_TAGS, self._validations,
                                       np.asarray(info.validation_iteration))):
            for field, tag in tags.items():
                values = np.asarray(getattr(info, field), dtype=np.float64)
                for step, value in zip(steps_of[start:].tolist(), values[start:].tolist()):
                    self._writer.add_scalar(tag, value, global_step=step)
        self._iterations, self._validations = steps.size, len(info.validation_iteration)

    def close(self, info=None) -> None:
        """Write what is left of ``info`` (the finished ``TrainingInfo``) and close the file."""
        if info is not None:
            self.update(info)
        self._writer.close()
