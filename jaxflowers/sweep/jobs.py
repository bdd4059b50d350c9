"""``train_job``: the job function of a training sweep (the MATLAB example's ``trainnet``
inside ``parfeval``), plus the data and model specs it understands.

Everything here runs inside a worker, so JAX is imported inside the functions: importing
this module (as ``jaxflowers.sweep`` does) must not import JAX in the caller.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxflowers import recipes  # imports no JAX
from jaxflowers.sweep.channel import report


def train_job(*, data, model, options, execution=None, seed: int | None = None):
    """Train one network in a sweep job and stream its progress to the pool.

    MATLAB: the function handed to ``parfeval`` in "Train Deep Learning Networks in
    Parallel" (``trainnet`` with an ``OutputFcn`` that ``send``s to a DataQueue).

    Args:
      data: a data spec or plan (``jaxflowers.recipes``: "digits", "cifar10", a folder,
        ``{"folder": path, "image_size": [h, w]}``, an image set, or ``{"train": spec,
        "validation": spec | fraction}``...); the plan's training and validation sets are
        used.
      model: a model spec (``recipes.build_model``), e.g. ``("cifar_net", {"depth": 2})``
        or ``("resnet50", {"num_classes": 5})``; ``num_classes`` defaults to the data's.
      options: a dict of ``TrainingOptions`` fields (JSON-able; ``ExecutionOptions``
        fields such as ``steps_per_dispatch`` are routed to ``execution``), or a
        ``TrainingOptions`` without ``output_fn``. Validation data, if any, comes from
        ``data``; ``plots`` is set to "none" (draw ``plots.sweep_progress(pool)`` in the
        caller instead).
      execution: how the job's training runs (``train(..., execution=...)``): a dict of
        ``ExecutionOptions`` fields or ``ExecutionOptions``; None: the defaults.
      seed: overrides ``options["seed"]`` (initialisation, shuffling, augmentation).

    Returns:
      ``(net, info)`` as ``jaxflowers.train`` returns them. From a pool they come back
      through files (arrays in npz, the rest JSON) and are rebuilt in the caller by
      ``Future.result()``, so ``nets, infos = fetch_outputs(futures)``.

    Every ``output_fn`` message of ``train`` ({"state", "iteration", "epoch", "loss",
    "accuracy", "learn_rate"}, plus "validation_loss"/"validation_accuracy" after a
    validation) is forwarded with ``report``, so ``DevicePool.after_each`` sees it. A run
    that diverged (``info.diverged``) still returns ``(net, info)`` (the last finite
    network), after a last message ``{"state": "failed", "error": info.stop_reason}``.

    Compiled programs are shared through the persistent compilation cache
    (``enable_compilation_cache``), so a job that repeats an earlier job's network and
    shapes loads them instead of compiling.
    """
    from jaxflowers.compilation.cache import enable_compilation_cache
    from jaxflowers.training.run import train  # robust whether or not jaxflowers/__init__ is lazy

    enable_compilation_cache()

    train_set, validation_set, _ = recipes.load_plan(data)
    module = recipes.build_model(model, num_classes=len(train_set.class_names))
    options, execution = _options(options, execution, seed, validation_set)
    net, info = train(train_set, module, options, execution=execution)
    if info.diverged:
        report({"state": "failed", "error": info.stop_reason})
    return net, info


def _send_to_pool(message: dict) -> bool:
    """``output_fn`` of a sweep job: send every message to the pool, never stop early."""
    report(message)
    return False


def job_options(options, execution=None) -> tuple[Any, Any]:
    """``(TrainingOptions, ExecutionOptions)`` from a job's ``options`` and ``execution``.

    Imports no JAX, so a caller can check options before any worker starts.

    Args:
      options: a dict of ``TrainingOptions`` fields (``augmentation`` may be a dict of
        ``Augmentation`` fields), where ``ExecutionOptions`` fields (e.g.
        ``steps_per_dispatch``) are accepted too and go to the second; or
        ``TrainingOptions``.
      execution: None, a dict of ``ExecutionOptions`` fields, or ``ExecutionOptions``;
        execution fields given in ``options`` replace its.

    Raises:
      ValueError: naming the option that is unknown or whose value is not allowed.
      TypeError: ``options`` or ``execution`` is of another type.
    """
    from jaxflowers.options import ExecutionOptions, TrainingOptions

    fields = _fields(options, TrainingOptions, "options")
    routed = {f.name: fields.pop(f.name) for f in dataclasses.fields(ExecutionOptions)
              if f.name in fields}
    known = [f.name for f in dataclasses.fields(TrainingOptions)]
    unknown = [name for name in fields if name not in known]
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}: neither TrainingOptions nor "
                         f"ExecutionOptions has such a field (TrainingOptions: "
                         f"{', '.join(known)})")
    execution = {**_fields(execution or {}, ExecutionOptions, "execution"), **routed}
    return TrainingOptions.from_dict(fields), ExecutionOptions.from_dict(execution)


def _fields(value, cls, what: str) -> dict:
    """The init fields of a ``cls`` instance or a dict of them, as a new dict."""
    if isinstance(value, cls):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{what} must be a dict of {cls.__name__} fields or a {cls.__name__}, "
                    f"not {type(value).__name__}")


def _options(options, execution, seed: int | None, validation_set):
    options, execution = job_options(options, execution)
    changes = {"output_fn": _send_to_pool, "plots": "none"}  # plots.sweep_progress(pool) draws
    if seed is not None:
        changes["seed"] = seed
    if validation_set is not None:
        changes["validation_data"] = validation_set
    return options.replace(**changes), execution
