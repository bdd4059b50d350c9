"""``TrainingInfo``: what ``train`` measured, iteration by iteration (MATLAB's ``info``)."""
from __future__ import annotations

import csv
import dataclasses
import os

import numpy as np

from jaxflowers.training.stop import StopReason

__all__ = ["COLUMNS", "TrainingInfo"]

# The columns of ``TrainingInfo.to_csv`` / ``to_dataframe``, one row per iteration.
COLUMNS = ("iteration", "epoch", "loss", "accuracy", "learn_rate", "validation_loss",
           "validation_accuracy")

@dataclasses.dataclass
class TrainingInfo:
    """What ``train`` measured (MATLAB's ``info``/``TrainingHistory``).

    One entry per iteration run (I) or per validation (V); accuracies in percent, other metrics
    fractions. ``final_validation_*`` score the returned network (``output_network_iteration``).
    """

    iteration: np.ndarray  # int (I,)
    epoch: np.ndarray  # int (I,)
    loss: np.ndarray  # float (I,), mini-batch cross-entropy
    accuracy: np.ndarray  # float (I,), mini-batch accuracy in %
    learn_rate: np.ndarray  # float (I,), the rate the solver used
    validation_iteration: np.ndarray  # int (V,)
    validation_loss: np.ndarray  # float (V,)
    validation_accuracy: np.ndarray  # float (V,), %
    # float (V,) per name in TrainingOptions.metrics besides "accuracy": fscore, precision,
    # recall, auc (fractions, macro over classes); what a progress plot draws besides loss
    validation_metrics: dict = dataclasses.field(default_factory=dict)
    output_network_iteration: int = 0  # the iteration of the returned network (MATLAB's name)
    # The returned network on the validation set (None: the last validation's scores).
    final_validation_loss: float | None = None
    final_validation_accuracy: float | None = None  # %
    final_validation_metrics: dict = dataclasses.field(default_factory=dict)  # name -> value
    # Seconds from the call to the first step (setup), and within it, overlapping, until
    # every program the steps and validations need was compiled (the initial state's
    # computed) and until the training and validation images and their channel statistics
    # were on the devices. The population pass compiles later, while the network trains.
    setup_time: float = 0.0
    compile_time: float = 0.0
    placing_time: float = 0.0
    train_time: float = 0.0  # seconds of the training loop, validation included
    validation_time: float = 0.0  # seconds of that the host waited for validation results
    images_per_second: float = 0.0  # training images / (train_time - validation_time)
    num_devices: int = 1
    data_placement: str = "resident"  # "resident" (copied to the devices) or "stream"
    stopped_early: bool = False  # training ended before max_epochs (see stopped_by)
    stop_reason: str = "max epochs completed"  # MATLAB's StopReason in words, e.g.
    # "met validation criterion", "training loss is NaN at iteration 12"
    stopped_by: StopReason = StopReason.MAX_EPOCHS  # the same as a StopReason
    checkpoint: str | None = None  # folder of the newest checkpoint written, if any
    max_epochs: int | None = None  # the epochs planned (MaxEpochs); None: not known
    iterations_per_epoch: int | None = None  # complete mini-batches per epoch

    def __post_init__(self):
        self.stopped_by = StopReason(self.stopped_by)  # its value, from a JSON record
        # train gives the returned network's scores; an info built otherwise (the record so
        # far, during training) takes the last validation's.
        if len(self.validation_iteration):
            if self.final_validation_loss is None:
                self.final_validation_loss = float(self.validation_loss[-1])
            if self.final_validation_accuracy is None:
                self.final_validation_accuracy = float(self.validation_accuracy[-1])
            if not self.final_validation_metrics:
                self.final_validation_metrics = {k: float(v[-1]) for k, v in
                                                 self.validation_metrics.items() if len(v)}

    def __repr__(self) -> str:
        accuracy = self.final_validation_accuracy
        scored = "" if accuracy is None else f", final validation accuracy {accuracy:.2f}%"
        return (f"TrainingInfo({len(self.iteration)} iterations, "
                f"{len(self.validation_iteration)} validations{scored}, "
                f"stop_reason={self.stop_reason!r})")

    def to_dict(self) -> dict:
        """The fields as JSON-able data and numpy arrays (``from_dict`` inverts it)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["stopped_by"] = self.stopped_by.value
        return fields

    @classmethod
    def from_dict(cls, fields: dict) -> "TrainingInfo":
        return cls(**fields)

    @property
    def diverged(self) -> bool:
        """Whether training stopped on a loss or gradient that was not finite."""
        return self.stopped_by.diverged

    def to_csv(self, path) -> str:
        """Write the per-iteration history as CSV, one row per iteration (``writetable``).

        Args:
          path: the file to write; its folder must exist.

        Returns:
          The path written, as a str (columns ``COLUMNS``; validation ones empty elsewhere).
        """
        columns = self._columns()
        path = os.fspath(path)
        with open(path, "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(COLUMNS)
            for row in zip(*(columns[name].tolist() for name in COLUMNS)):
                writer.writerow("" if v != v else v for v in row)  # NaN (no validation): empty
        return path

    def to_dataframe(self):
        """The ``to_csv`` columns as a pandas ``DataFrame`` (MATLAB's ``TrainingHistory``)."""
        try:
            import pandas
        except ImportError as error:
            raise ImportError("TrainingInfo.to_dataframe needs pandas (pip install pandas); "
                              "TrainingInfo.to_csv(path) needs nothing extra") from error
        return pandas.DataFrame(self._columns(), columns=list(COLUMNS))

    def _columns(self) -> dict[str, np.ndarray]:
        """``COLUMNS`` as arrays of one entry per iteration; NaN where not validated."""
        iteration = np.asarray(self.iteration, dtype=np.int64)
        where = {int(it): i for i, it in enumerate(iteration)}
        missing = [int(it) for it in self.validation_iteration if int(it) not in where]
        if missing:
            raise ValueError(f"TrainingInfo: validation_iteration {missing} are not among the "
                             f"{len(iteration)} training iterations")
        rows = [where[int(it)] for it in self.validation_iteration]
        columns = {"iteration": iteration, "epoch": np.asarray(self.epoch, dtype=np.int64)}
        for name in COLUMNS[2:5]:
            columns[name] = np.asarray(getattr(self, name), dtype=np.float64)
        for name in COLUMNS[5:]:
            columns[name] = np.full(len(iteration), np.nan)
            columns[name][rows] = np.asarray(getattr(self, name), dtype=np.float64)
        lengths = {name: len(values) for name, values in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"TrainingInfo: per-iteration fields differ in length: {lengths}")
        return columns
