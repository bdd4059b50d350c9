"""Training options (MATLAB's ``trainingOptions``)."""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

from jaxflowers import schedules
from jaxflowers.data.augment import Augmentation
from jaxflowers.options.validate import check_choice, check_float, check_int

__all__ = ["BN_STATISTICS", "CHECKPOINT_FAILURES", "CHECKPOINT_UNITS", "DEFAULT_LEARN_RATE",
           "DEFAULT_SQUARED_DECAY", "ENVIRONMENTS", "METRICS", "METRIC_NAMES", "OUTPUT_NETWORKS",
           "PLOTS", "SHUFFLES", "SOLVERS", "THRESHOLD_METHODS", "TrainingOptions", "recipe_fields"]

SOLVERS = ("sgdm", "rmsprop", "adam")
SHUFFLES = ("once", "every-epoch", "never")
ENVIRONMENTS = ("auto", "cpu", "gpu", "multi-gpu")
PLOTS = ("none", "training-progress")
CHECKPOINT_UNITS = ("epoch", "iteration")
CHECKPOINT_FAILURES = ("warn", "stop")
THRESHOLD_METHODS = ("l2norm", "global-l2norm", "absolute-value")
OUTPUT_NETWORKS = ("auto", "last-iteration", "best-validation")
METRICS = ("accuracy", "fscore", "precision", "recall", "auc")
# How tables and figures title each metric.
METRIC_NAMES = {"accuracy": "Accuracy", "fscore": "F-score", "precision": "Precision",
                "recall": "Recall", "auc": "AUC"}
BN_STATISTICS = ("population", "moving")
# MATLAB's defaults per solver: InitialLearnRate, SquaredGradientDecayFactor.
DEFAULT_LEARN_RATE = {"sgdm": 0.01, "rmsprop": 0.001, "adam": 0.001}
DEFAULT_SQUARED_DECAY = {"rmsprop": 0.9, "adam": 0.999}


def _run_only(default):
    """A field that does not change what a run computes; a resumed run may change it."""
    return dataclasses.field(default=default, metadata={"recipe": False})


@dataclasses.dataclass(frozen=True)
class TrainingOptions:
    """Everything ``train`` needs besides data and model (MATLAB ``trainingOptions``, snake case).

    A bad value raises ``ValueError`` naming the field, the value and what is allowed."""

    solver: str = "sgdm"  # "sgdm" (SGD with momentum), "rmsprop" or "adam"
    initial_learn_rate: float | None = None  # None: MATLAB's default, 0.01 sgdm / 0.001 others
    mini_batch_size: int = 128  # global mini-batch, split evenly over the devices
    max_epochs: int = _run_only(30)  # full passes over the training data
    shuffle: str = "once"  # "once", "every-epoch" or "never"
    l2_regularization: float = 1e-4  # L2 factor on every parameter (coupled, as MATLAB)
    momentum: float = 0.9  # sgdm only
    gradient_decay_factor: float = 0.9  # adam beta1
    squared_gradient_decay_factor: float | None = None  # None: 0.9 rmsprop, 0.999 adam
    epsilon: float = 1e-8  # rmsprop and adam denominator offset
    gradient_threshold: float = math.inf  # clip gradients beyond this (inf: never)
    gradient_threshold_method: str = "l2norm"  # or "global-l2norm", "absolute-value"
    learn_rate_schedule: Any = "none"  # a schedules.NAMES name, a schedules object, or a sequence
    learn_rate_drop_factor: float = 0.1  # piecewise: multiply the rate by this ...
    learn_rate_drop_period: int = 10  # ... every this many epochs
    validation_data: Any = _run_only(None)  # an image set evaluated during training, or None
    validation_frequency: int = _run_only(50)  # iterations between validations
    validation_patience: float = math.inf  # validations without a better objective that stop it
    objective_metric_name: str = "loss"  # what patience and the best network go by
    metrics: tuple[str, ...] = ()  # validation metrics among METRICS (macro over classes)
    output_network: str = "auto"  # "last-iteration", "best-validation"; "auto": best if validating
    batch_normalization_statistics: str = "population"  # or "moving"; population: a pass at the end
    augmentation: Augmentation | None = None  # applied on the device to training batches
    execution_environment: str = _run_only("auto")  # "auto", "cpu", "gpu" or "multi-gpu"
    verbose: bool = _run_only(True)  # print MATLAB's progress table
    verbose_frequency: int = _run_only(50)  # iterations between table rows
    plots: str = _run_only("none")  # "none" or "training-progress" (live in Jupyter)
    plots_path: str | os.PathLike | None = _run_only(None)  # None: training_progress.png
    log_dir: str | os.PathLike | None = _run_only(None)  # TensorBoard scalars (tensorboardX)
    output_fn: Callable[[dict], Any] | None = _run_only(None)  # per iteration; True stops
    seed: int = 0  # initialisation, shuffling and augmentation
    checkpoint_path: str | os.PathLike | None = _run_only(None)  # checkpoint folder; None: none
    checkpoint_frequency: int = _run_only(1)  # save every this many checkpoint_frequency_unit
    checkpoint_frequency_unit: str = _run_only("epoch")  # "epoch" or "iteration"
    checkpoint_keep: int = _run_only(3)  # newest checkpoints kept (older ones removed)
    checkpoint_failure: str = _run_only("warn")  # a save that fails: "warn" and go on, or "stop"
    # setLearnRateFactor / freezeNetwork: (glob over "/"-joined parameter paths, factor)
    # pairs, later ones winning, e.g. {"*": 0, "head": 10}; 0 freezes (training.learn_rates)
    learn_rate_factors: Any = ()

    def __post_init__(self):
        check_choice(self, "solver", SOLVERS)
        check_choice(self, "shuffle", SHUFFLES)
        if isinstance(self.learn_rate_schedule, list):
            object.__setattr__(self, "learn_rate_schedule", tuple(self.learn_rate_schedule))
        schedules.check(self.learn_rate_schedule)
        check_choice(self, "gradient_threshold_method", THRESHOLD_METHODS)
        check_choice(self, "output_network", OUTPUT_NETWORKS)
        check_choice(self, "batch_normalization_statistics", BN_STATISTICS)
        check_choice(self, "execution_environment", ENVIRONMENTS)
        check_choice(self, "plots", PLOTS)
        check_choice(self, "checkpoint_frequency_unit", CHECKPOINT_UNITS)
        check_choice(self, "checkpoint_failure", CHECKPOINT_FAILURES)
        for name in ("mini_batch_size", "max_epochs", "learn_rate_drop_period",
                     "validation_frequency", "verbose_frequency", "checkpoint_frequency",
                     "checkpoint_keep"):
            check_int(self, name, minimum=1)
        check_int(self, "seed", minimum=0)
        if self.initial_learn_rate is not None:
            check_float(self, "initial_learn_rate", low=0, low_open=True)
        check_float(self, "l2_regularization", low=0)
        check_float(self, "learn_rate_drop_factor", low=0, high=1)
        for name in ("momentum", "gradient_decay_factor"):
            check_float(self, name, low=0, high=1, high_open=True)
        if self.squared_gradient_decay_factor is not None:
            check_float(self, "squared_gradient_decay_factor", low=0, high=1, high_open=True)
        check_float(self, "epsilon", low=0, low_open=True)
        _check_positive_or_inf(self, "gradient_threshold", integer=False)
        _check_positive_or_inf(self, "validation_patience", integer=True)
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
        object.__setattr__(self, "learn_rate_factors", _factor_pairs(self.learn_rate_factors))
        self._check_validation_choices()

    def _check_validation_choices(self) -> None:
        metrics = (self.metrics,) if isinstance(self.metrics, str) else self.metrics
        if not isinstance(metrics, (tuple, list)) or any(
                not isinstance(m, str) or m not in METRICS for m in metrics) or len(
                set(metrics)) != len(metrics):
            raise ValueError(f"metrics={self.metrics!r} must be distinct names among "
                             f"{', '.join(METRICS)}")
        object.__setattr__(self, "metrics", tuple(metrics))
        allowed = ("loss", "accuracy", *self.metrics)
        if self.objective_metric_name not in allowed:
            raise ValueError(f"objective_metric_name={self.objective_metric_name!r} is not "
                             f"allowed; use one of {', '.join(dict.fromkeys(allowed))} (a "
                             "metric must also be in metrics)")
        if self.validation_data is None:
            for name, value in (("output_network", "best-validation"),
                                ("validation_patience", self.validation_patience)):
                if getattr(self, name) == value and value != math.inf:
                    raise ValueError(f"{name}={value!r} needs validation_data")

    @property
    def squared_decay(self) -> float:
        """The squared-gradient decay in force (the solver's MATLAB default when None)."""
        if self.squared_gradient_decay_factor is None:
            return DEFAULT_SQUARED_DECAY.get(self.solver, DEFAULT_SQUARED_DECAY["adam"])
        return float(self.squared_gradient_decay_factor)

    @property
    def best_validation(self) -> bool:
        """Whether ``train`` returns the best-validation network ("auto": when validating)."""
        return self.output_network == "best-validation" or (
            self.output_network == "auto" and self.validation_data is not None)

    @property
    def learn_rate(self) -> float:
        """The initial learning rate in force (the solver's default when none was given)."""
        if self.initial_learn_rate is None:
            return DEFAULT_LEARN_RATE[self.solver]
        return float(self.initial_learn_rate)

    def replace(self, **changes) -> "TrainingOptions":
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def scaled(self, num_devices: int) -> "TrainingOptions":
        """The multi-GPU rule (Goyal et al. 2017): batch and learning rate x ``num_devices``,
        reading ``mini_batch_size`` as the per-device batch."""
        if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
            raise ValueError(f"num_devices={num_devices!r} must be a positive integer")
        return self.replace(mini_batch_size=self.mini_batch_size * num_devices,
                            initial_learn_rate=self.learn_rate * num_devices)

    def to_dict(self) -> dict:
        """The fields as JSON-able data (``validation_data`` as it is); ``from_dict`` inverts it.

        Raises ``TypeError`` when ``output_fn`` is set (a function cannot be written down)."""
        if self.output_fn is not None:
            raise TypeError("TrainingOptions.output_fn cannot travel to another process or "
                            "file; a sweep job reports progress with jaxflowers.sweep.report")
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["augmentation"] = (None if self.augmentation is None
                                  else dataclasses.asdict(self.augmentation))
        fields["learn_rate_schedule"] = schedules.to_plain(self.learn_rate_schedule)
        fields["metrics"] = list(self.metrics)
        fields["learn_rate_factors"] = dict(self.learn_rate_factors)
        for name in ("plots_path", "log_dir", "checkpoint_path"):
            fields[name] = None if fields[name] is None else os.fspath(fields[name])
        return fields

    @classmethod
    def from_dict(cls, fields) -> "TrainingOptions":
        """Options from ``to_dict``'s data or any dict of fields (unknown ones: ``ValueError``)."""
        fields = dict(fields)
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = [name for name in fields if name not in known]
        if unknown:
            raise ValueError(f"unknown option {unknown[0]!r}: TrainingOptions has no such "
                             f"field (it has {', '.join(known)})")
        augmentation = fields.get("augmentation")
        if isinstance(augmentation, dict):
            try:
                fields["augmentation"] = Augmentation(**augmentation)
            except TypeError as error:
                raise ValueError(f"augmentation={augmentation!r}: {error}") from None
        if "learn_rate_schedule" in fields:
            fields["learn_rate_schedule"] = schedules.from_plain(fields["learn_rate_schedule"])
        return cls(**fields)


def recipe_fields() -> tuple[str, ...]:
    """The fields a resumed run must share with its checkpoint (all but the ``_run_only`` ones)."""
    return tuple(f.name for f in dataclasses.fields(TrainingOptions)
                 if f.metadata.get("recipe", True))


def _check_positive_or_inf(owner, name: str, *, integer: bool) -> None:
    value = getattr(owner, name)
    kinds = (int,) if integer else (int, float)
    ok = not isinstance(value, bool) and (value == math.inf or (
        isinstance(value, kinds) and value > 0 and math.isfinite(value)))
    if not ok:
        what = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name}={value!r} must be {what} or math.inf")


def _factor_pairs(value) -> tuple[tuple[str, float], ...]:
    """``learn_rate_factors`` as ``((pattern, factor), ...)`` from a dict or pairs."""
    try:
        pairs = tuple(value.items()) if isinstance(value, dict) else tuple(
            (p, f) for p, f in value)
    except (TypeError, ValueError):
        pairs = None
    ok = pairs is not None and all(
        isinstance(p, str) and p and isinstance(f, (int, float)) and not isinstance(f, bool)
        and math.isfinite(f) and f >= 0 for p, f in pairs)
    if not ok:
        raise ValueError(f"learn_rate_factors={value!r} must map parameter path patterns "
                         "(glob) to finite factors >= 0, e.g. {'*': 0.0, 'head': 10.0}")
    return tuple((p, float(f)) for p, f in pairs)


def _check_data(data) -> None:
    if data is None:
        return
    missing = [a for a in ("images", "labels", "class_names") if not hasattr(data, a)]
    if missing:
        raise ValueError(f"validation_data={type(data).__name__} lacks {', '.join(missing)}; "
                         "pass an ImageSet, an ImageFolder or None")
