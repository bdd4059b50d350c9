"""Training options (MATLAB's ``trainingOptions``) and the multi-GPU scaling rule."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from jaxflowers.data.augment import Augmentation
from jaxflowers.fields import check_choice, check_float, check_int

SOLVERS = ("sgdm", "adam")
SHUFFLES = ("once", "every-epoch", "never")
SCHEDULES = ("none", "piecewise")
ENVIRONMENTS = ("auto", "cpu", "gpu", "multi-gpu")
PLOTS = ("none", "training-progress")
CHECKPOINT_UNITS = ("epoch", "iteration")
# MATLAB's default InitialLearnRate per solver.
DEFAULT_LEARN_RATE = {"sgdm": 0.01, "adam": 0.001}


@dataclasses.dataclass(frozen=True)
class TrainingOptions:
    """Everything ``train`` needs besides data and model; MATLAB names in snake case.

    Validated on construction: a bad value raises ``ValueError`` naming the field, the value
    and what is allowed. Derived values (per-device batch, steps per epoch, schedule
    boundaries) are computed by the trainer, not stored. How the run executes (devices,
    precision, dispatch size, data placement) is ``ExecutionOptions``'s business.
    """

    solver: str = "sgdm"  # "sgdm" (SGD with momentum) or "adam"
    initial_learn_rate: float | None = None  # None: MATLAB's default, 0.01 sgdm / 0.001 adam
    mini_batch_size: int = 128  # global mini-batch, split evenly over the devices
    max_epochs: int = 30  # full passes over the training data
    shuffle: str = "once"  # "once", "every-epoch" or "never"
    l2_regularization: float = 1e-4  # L2 factor on every parameter (coupled, as MATLAB)
    momentum: float = 0.9  # sgdm only
    gradient_decay_factor: float = 0.9  # adam beta1
    squared_gradient_decay_factor: float = 0.999  # adam beta2
    epsilon: float = 1e-8  # adam denominator offset
    learn_rate_schedule: str = "none"  # "none" or "piecewise"
    learn_rate_drop_factor: float = 0.1  # piecewise: multiply the rate by this ...
    learn_rate_drop_period: int = 10  # ... every this many epochs
    validation_data: Any = None  # an image set evaluated during training, or None
    validation_frequency: int = 50  # iterations between validations
    augmentation: Augmentation | None = None  # applied on the device to training batches
    execution_environment: str = "auto"  # "auto", "cpu", "gpu" or "multi-gpu"
    verbose: bool = True  # print MATLAB's progress table
    verbose_frequency: int = 50  # iterations between table rows
    plots: str = "none"  # "none" or "training-progress" (live in Jupyter)
    plots_path: str | os.PathLike | None = None  # the plot's file; None: training_progress.png
    log_dir: str | os.PathLike | None = None  # folder for TensorBoard scalars (needs tensorboardX)
    output_fn: Callable[[dict], Any] | None = None  # called per iteration; True stops training
    seed: int = 0  # initialisation, shuffling and augmentation
    checkpoint_path: str | os.PathLike | None = None  # folder for checkpoints; None: none
    checkpoint_frequency: int = 1  # save every this many checkpoint_frequency_unit
    checkpoint_frequency_unit: str = "epoch"  # "epoch" or "iteration"
    checkpoint_keep: int = 3  # newest checkpoints kept in checkpoint_path (older ones removed)

    def __post_init__(self):
        check_choice(self, "solver", SOLVERS)
        check_choice(self, "shuffle", SHUFFLES)
        check_choice(self, "learn_rate_schedule", SCHEDULES)
        check_choice(self, "execution_environment", ENVIRONMENTS)
        check_choice(self, "plots", PLOTS)
        check_choice(self, "checkpoint_frequency_unit", CHECKPOINT_UNITS)
        for name in ("mini_batch_size", "max_epochs", "learn_rate_drop_period",
                     "validation_frequency", "verbose_frequency", "checkpoint_frequency",
                     "checkpoint_keep"):
            check_int(self, name, minimum=1)
        check_int(self, "seed", minimum=0)
        if self.initial_learn_rate is not None:
            check_float(self, "initial_learn_rate", low=0, low_open=True)
        check_float(self, "l2_regularization", low=0)
        check_float(self, "learn_rate_drop_factor", low=0, high=1)
        for name in ("momentum", "gradient_decay_factor", "squared_gradient_decay_factor"):
            check_float(self, name, low=0, high=1, high_open=True)
        check_float(self, "epsilon", low=0, low_open=True)
        for name, what in (("checkpoint_path", "a folder path"), ("log_dir", "a folder path"),
                           ("plots_path", "a file path")):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (str, os.PathLike)) or value == ""):
                raise ValueError(f"{name}={value!r} must be {what} or None")
        if self.augmentation is not None and not isinstance(self.augmentation, Augmentation):
            raise ValueError(f"augmentation={self.augmentation!r} must be a "
                             "jaxflowers.data.Augmentation or None")
        if self.output_fn is not None and not callable(self.output_fn):
            raise ValueError(f"output_fn={self.output_fn!r} must be callable or None")
        _check_data(self.validation_data)

    @property
    def learn_rate(self) -> float:
        """The initial learning rate in force (the solver's default when none was given)."""
        if self.initial_learn_rate is None:
            return DEFAULT_LEARN_RATE[self.solver]
        return float(self.initial_learn_rate)

    def replace(self, **changes) -> "TrainingOptions":
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)


def scale_for_devices(options: TrainingOptions, num_devices: int | None = None, *,
                      verbose: bool | None = None) -> TrainingOptions:
    """The MATLAB multi-GPU example's rule: batch x N, learning rate x N.

    ``options.mini_batch_size`` is read as the per-device batch; the returned options hold
    the global batch ``mini_batch_size * N`` and a learning rate scaled linearly with the
    global batch over that reference batch (Goyal et al. 2017).

    Args:
      options: options whose ``mini_batch_size`` is the per-device batch.
      num_devices: N; None counts every device ``options.execution_environment`` selects.
      verbose: print what changed (default: ``options.verbose``).

    Returns:
      New ``TrainingOptions``.
    """
    if num_devices is None:
        from jaxflowers.parallel import select_devices  # imports JAX only when asked to count
        num_devices = len(select_devices(options.execution_environment))
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"num_devices={num_devices!r} must be a positive integer")
    scaled = options.replace(mini_batch_size=options.mini_batch_size * num_devices,
                             initial_learn_rate=options.learn_rate * num_devices)
    if options.verbose if verbose is None else verbose:
        print(f"scale_for_devices: {num_devices} device(s): mini_batch_size "
              f"{options.mini_batch_size} -> {scaled.mini_batch_size}, initial_learn_rate "
              f"{options.learn_rate:g} -> {scaled.learn_rate:g}")
    return scaled


def _check_data(data) -> None:
    if data is None:
        return
    missing = [a for a in ("images", "labels", "class_names") if not hasattr(data, a)]
    if missing:
        raise ValueError(f"validation_data={type(data).__name__} lacks {', '.join(missing)}; "
                         "pass an ImageSet, an ImageFolder or None")
