"""Training options (MATLAB's ``trainingOptions``) and the multi-GPU scaling rule."""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

from jaxflowers.data.augment import Augmentation

SOLVERS = ("sgdm", "adam")
SHUFFLES = ("once", "every-epoch", "never")
SCHEDULES = ("none", "piecewise")
ENVIRONMENTS = ("auto", "cpu", "gpu", "multi-gpu")
PLOTS = ("none", "training-progress")
PRECISIONS = ("auto", "float32", "bfloat16")
STRATEGIES = ("shard_map", "pmap")
PLACEMENTS = ("auto", "resident", "stream")
PARAMETER_LAYOUTS = ("auto", "tree", "flat")
# MATLAB's default InitialLearnRate per solver.
DEFAULT_LEARN_RATE = {"sgdm": 0.01, "adam": 0.001}


@dataclasses.dataclass(frozen=True)
class TrainingOptions:
    """Everything ``train`` needs besides data and model; MATLAB names in snake case.

    Validated on construction: a bad value raises ``ValueError`` naming the field, the value
    and what is allowed. Derived values (per-device batch, steps per epoch, schedule
    boundaries) are computed by the trainer, not stored.
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
    num_devices: int | None = None  # use only the first N devices of that environment
    verbose: bool = True  # print MATLAB's progress table
    verbose_frequency: int = 50  # iterations between table rows
    plots: str = "none"  # "none" or "training-progress" (live in Jupyter)
    plots_path: str | os.PathLike | None = None  # the plot's file; None: training_progress.png
    log_dir: str | os.PathLike | None = None  # folder for TensorBoard scalars (needs tensorboardX)
    output_fn: Callable[[dict], Any] | None = None  # called per iteration; True stops training
    seed: int = 0  # initialisation, shuffling and augmentation
    precision: str = "auto"  # compute dtype; "auto": bfloat16 on GPU, float32 on CPU
    sync_batch_norm: bool = False  # batch-norm statistics over the global batch
    strategy: str = "shard_map"  # "shard_map" or "pmap"
    steps_per_dispatch: int | None = None  # steps per compiled call; None picks by image size
    data_placement: str = "auto"  # "resident" on every device, "stream" from host; "auto": by size
    parameter_layout: str = "auto"  # "flat" (one vector), "tree" (per leaf); "auto": flat on GPUs

    def __post_init__(self):
        _check_choice(self, "solver", SOLVERS)
        _check_choice(self, "shuffle", SHUFFLES)
        _check_choice(self, "learn_rate_schedule", SCHEDULES)
        _check_choice(self, "execution_environment", ENVIRONMENTS)
        _check_choice(self, "plots", PLOTS)
        _check_choice(self, "precision", PRECISIONS)
        _check_choice(self, "strategy", STRATEGIES)
        _check_choice(self, "data_placement", PLACEMENTS)
        _check_choice(self, "parameter_layout", PARAMETER_LAYOUTS)
        for name in ("mini_batch_size", "max_epochs", "learn_rate_drop_period",
                     "validation_frequency", "verbose_frequency"):
            _check_int(self, name, minimum=1)
        _check_int(self, "seed", minimum=0)
        for name in ("num_devices", "steps_per_dispatch"):
            if getattr(self, name) is not None:
                _check_int(self, name, minimum=1)
        if self.initial_learn_rate is not None:
            _check_float(self, "initial_learn_rate", low=0, low_open=True)
        _check_float(self, "l2_regularization", low=0)
        _check_float(self, "learn_rate_drop_factor", low=0, high=1)
        for name in ("momentum", "gradient_decay_factor", "squared_gradient_decay_factor"):
            _check_float(self, name, low=0, high=1, high_open=True)
        _check_float(self, "epsilon", low=0, low_open=True)
        if self.augmentation is not None and not isinstance(self.augmentation, Augmentation):
            raise ValueError(f"augmentation={self.augmentation!r} must be a "
                             "jaxflowers.data.Augmentation or None")
        if self.output_fn is not None and not callable(self.output_fn):
            raise ValueError(f"output_fn={self.output_fn!r} must be callable or None")
        _check_data(self.validation_data)
        for name in ("plots_path", "log_dir"):
            _check_path(self, name)

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
      num_devices: N; None counts the devices ``options.execution_environment`` and
        ``options.num_devices`` select.
      verbose: print what changed (default: ``options.verbose``).

    Returns:
      New ``TrainingOptions``.
    """
    if num_devices is None:
        from jaxflowers.parallel import select_devices  # imports JAX only when asked to count
        num_devices = len(select_devices(options.execution_environment, options.num_devices))
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"num_devices={num_devices!r} must be a positive integer")
    scaled = options.replace(mini_batch_size=options.mini_batch_size * num_devices,
                             initial_learn_rate=options.learn_rate * num_devices)
    if options.verbose if verbose is None else verbose:
        print(f"scale_for_devices: {num_devices} device(s): mini_batch_size "
              f"{options.mini_batch_size} -> {scaled.mini_batch_size}, initial_learn_rate "
              f"{options.learn_rate:g} -> {scaled.learn_rate:g}")
    return scaled


def _check_choice(options, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(options, name)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; use one of {', '.join(allowed)}")


def _check_int(options, name: str, *, minimum: int) -> None:
    value = getattr(options, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


def _check_float(options, name: str, *, low: float, high: float = math.inf,
                 low_open: bool = False, high_open: bool = False) -> None:
    value = getattr(options, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    ok = ok and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name}={value!r} must be a finite number in {interval}")


def _check_path(options, name: str) -> None:
    value = getattr(options, name)
    if value is not None and (not isinstance(value, (str, os.PathLike)) or value == ""):
        raise ValueError(f"{name}={value!r} must be a file system path (str or os.PathLike) "
                         "or None")


def _check_data(data) -> None:
    if data is None:
        return
    missing = [a for a in ("images", "labels", "class_names") if not hasattr(data, a)]
    if missing:
        raise ValueError(f"validation_data={type(data).__name__} lacks {', '.join(missing)}; "
                         "pass an ImageSet, an ImageFolder or None")
