"""Where an experiment's parameters go, checked before any worker starts.

A parameter (or fixed setting) is a ``TrainingOptions`` field, an ``ExecutionOptions``
field, an argument of the network (``recipes.MODEL_ARGUMENTS``: cifar_net's depth and
width...), ``model`` (the network's registry name) or ``data`` (a data set). A ``Design``
is an experiment's fixed part; ``Design.job`` turns one point of the parameters into the
keyword arguments of ``trial_job``. Imports no JAX.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Any, Mapping

from jaxflowers import recipes
from jaxflowers.sweep.example.data import example_plan
from jaxflowers.sweep.experiment.params import Parameter, ParameterError, Values

__all__ = ["Design"]

# Fields a trial's job owns: its validation set, its progress channel, its figures.
_RESERVED = ("validation_data", "output_fn", "plots", "plots_path", "checkpoint_path",
             "log_dir")
NOMINAL_TRAIN = 1000  # training images assumed when options are checked before loading data
# What options are checked with for validation data: every trial validates on its plan's
# validation set, which the caller does not load.
_VALIDATION = types.SimpleNamespace(images=(), labels=(), class_names=())


def _fields(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


@dataclasses.dataclass(frozen=True)
class Design:
    """An experiment's fixed part: recipe, data, network and settings, and the parameters.

    Attributes:
      recipe: a ``recipes.RECIPES`` name.
      data: the data set of every trial (unless ``data`` is a parameter).
      model: the network's registry name (unless ``model`` is a parameter).
      fixed: settings every trial shares (any name a parameter may have).
      space: the parameters, by name.
      seed: the data split's seed, and the training seed unless set otherwise.
    """

    recipe: str
    data: str
    model: str
    fixed: Mapping[str, Any]
    space: Mapping[str, Parameter]
    seed: int = 0

    def target(self, name: str) -> str:
        """Where ``name`` goes: "data", "model", "options", "execution" or "network".

        Raises:
          ParameterError: for a name that is none of them (or a field a trial owns).
        """
        from jaxflowers.options import ExecutionOptions, TrainingOptions

        if name in ("data", "model"):
            return name
        if name in _RESERVED:
            raise ParameterError(f"parameter {name!r} cannot vary: each trial sets it itself")
        if name in _fields(TrainingOptions):
            return "options"
        if name in _fields(ExecutionOptions):
            return "execution"
        if any(name in recipes.MODEL_ARGUMENTS.get(m, {}) for m in self._models()):
            return "network"
        arguments = sorted({argument for m in self._models()
                            for argument in recipes.MODEL_ARGUMENTS.get(m, {})})
        raise ParameterError(
            f"unknown parameter {name!r}: not a TrainingOptions or ExecutionOptions field, "
            f"nor an argument of {'/'.join(self._models())} ({', '.join(arguments)}), nor "
            "data or model")

    def job(self, point: Mapping[str, Any], folder: str) -> dict:
        """The keyword arguments of ``trial_job`` for one point of the parameters."""
        values = {**self.fixed, **point}
        model = values.get("model", self.model)
        parts: dict[str, dict] = {"options": {"seed": self.seed}, "execution": {},
                                  "network": {}}
        for name, value in values.items():
            where = self.target(name)
            if where in parts:
                parts[where][name] = value
        parts["execution"]["num_devices"] = parts["execution"].get("num_devices") or 1
        arguments = {k: v for k, v in parts["network"].items()
                     if k in recipes.MODEL_ARGUMENTS.get(model, {})}
        plan = example_plan(values.get("data", self.data), seed=self.seed,
                            image_size=recipes.IMAGE_SIZE.get(model, (224, 224)))
        return {"recipe": self.recipe, "data": plan, "model": (model, arguments),
                "options": parts["options"], "execution": parts["execution"],
                "folder": folder}

    def num_devices(self, point: Mapping[str, Any]) -> int:
        """The devices the trial of ``point`` trains on (``num_devices``, default 1)."""
        return int({**self.fixed, **point}.get("num_devices") or 1)

    def check(self, point: Mapping[str, Any], what: str) -> None:
        """Check the settings of one point as ``train`` would, without data or JAX.

        Args:
          point: parameter values (the others at their fixed values or defaults).
          what: how errors name the point ("parameter 'depth'", "point 3").

        Raises:
          ParameterError: ``what``, then the problem (an unknown name, a bad value).
        """
        from jaxflowers.sweep.experiment.trial import trial_options
        from jaxflowers.sweep.jobs import job_options

        try:
            job = self.job(point, folder=".")
            model, arguments = job["model"]
            _check_model(model, arguments)
            options = trial_options(self.recipe, job["execution"]["num_devices"],
                                    NOMINAL_TRAIN, job["options"], _VALIDATION)
            job_options(options, job["execution"])
            _check_batch(options.mini_batch_size, job["execution"]["num_devices"])
        except (ValueError, TypeError, recipes.DataUnavailableError) as error:
            raise ParameterError(f"{what}: {error}") from None

    def reported(self) -> tuple[str, ...]:
        """The validation values every trial reports: accuracy, loss, and ``metrics``'."""
        metrics = self.fixed.get("metrics") or ()
        return ("validation_accuracy", "validation_loss",
                *(f"validation_{m}" for m in ([metrics] if isinstance(metrics, str) else metrics)))

    def _models(self) -> tuple[str, ...]:
        varied = self.space.get("model")
        return tuple(varied.values) if isinstance(varied, Values) else (self.model,)


def _check_model(model: str, arguments: Mapping[str, Any]) -> None:
    if model not in recipes.MODELS:
        raise ParameterError(f"model {model!r} is not one of {', '.join(recipes.MODELS)}")
    for name, value in arguments.items():
        kind = recipes.MODEL_ARGUMENTS[model][name]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ParameterError(f"{model}'s {name} takes {kind.__name__} values, not "
                                 f"{value!r}")
        if kind is int and value < 1:
            raise ParameterError(f"{model}'s {name} must be at least 1, not {value!r}")


def _check_batch(batch: int, devices: int) -> None:
    if batch % devices:
        raise ParameterError(f"mini_batch_size={batch} does not split evenly over "
                             f"num_devices={devices}")
