"""``train_job``: the job function of a training sweep (the MATLAB example's ``trainnet``
inside ``parfeval``), plus the data and model specs it understands.

Everything here runs inside a worker, so JAX is imported inside the functions: importing
this module (as ``jaxflowers.sweep`` does) must not import JAX in the caller.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

from jaxflowers.sweep.channel import report

MODELS = ("cifar_net", "resnet18", "resnet34", "resnet50", "resnet101")


def train_job(*, data, model, options, seed: int | None = None):
    """Train one network in a sweep job and stream its progress to the pool.

    MATLAB: the function handed to ``parfeval`` in "Train Deep Learning Networks in
    Parallel" (``trainnet`` with an ``OutputFcn`` that ``send``s to a DataQueue).

    Args:
      data: a data spec (see :func:`load_data`): "digits", "cifar10", "tfds:NAME[:SPLIT]",
        a folder path, ``{"folder": path, "image_size": [h, w]}``, an image set, or
        ``{"train": spec, "validation": spec}``, where validation may also be a fraction
        of each label held out of the training set.
      model: ``(name, kwargs)``, e.g. ``("cifar_net", {"depth": 2})`` or
        ``("resnet50", {"num_classes": 5})``; ``num_classes`` defaults to the data's.
      options: a dict of ``TrainingOptions`` fields (JSON-able), or a ``TrainingOptions``
        without ``output_fn``. Validation data, if any, comes from ``data``; ``plots``
        is set to "none" (draw ``plots.sweep_progress(pool)`` in the caller instead).
      seed: overrides ``options["seed"]`` (initialisation, shuffling, augmentation).

    Returns:
      ``(net, info)`` as ``jaxflowers.train`` returns them. From a pool they come back
      through files (arrays in npz, the rest JSON) and are rebuilt in the caller by
      ``Future.result()``, so ``nets, infos = fetch_outputs(futures)``.

    Every ``output_fn`` message of ``train`` ({"state", "iteration", "epoch", "loss",
    "accuracy", "learn_rate"}, plus "validation_loss"/"validation_accuracy" after a
    validation) is forwarded with ``report``, so ``DevicePool.after_each`` sees it.

    Compiled programs are shared through the persistent compilation cache
    (``enable_compilation_cache``), so a job that repeats an earlier job's network and
    shapes loads them instead of compiling.
    """
    from jaxflowers.compile_cache import enable_compilation_cache
    from jaxflowers.train import train  # robust whether or not jaxflowers/__init__ is lazy

    enable_compilation_cache()

    train_set, validation_set = load_data(data)
    module = build_model(model, num_classes=len(train_set.class_names))
    options, execution = _options(options, seed, validation_set)
    return train(train_set, module, options, execution=execution)


def _forward(message: dict) -> bool:
    """``output_fn`` of a sweep job: send every message to the pool, never stop early."""
    report(message)
    return False


def _options(options, seed: int | None, validation_set):
    """(TrainingOptions, ExecutionOptions) from a job's options; ``ExecutionOptions``
    fields given among them (e.g. ``steps_per_dispatch``) go to the second."""
    from jaxflowers.execution import ExecutionOptions
    from jaxflowers.options import TrainingOptions

    if isinstance(options, TrainingOptions):
        fields = {name: getattr(options, name) for name in options.__dataclass_fields__}
    elif isinstance(options, Mapping):
        fields = dict(options)
    else:
        raise TypeError(f"options must be a dict of TrainingOptions fields or a "
                        f"TrainingOptions, not {type(options).__name__}")
    if isinstance(fields.get("augmentation"), Mapping):
        from jaxflowers.data import Augmentation

        fields["augmentation"] = Augmentation(**fields["augmentation"])
    if seed is not None:
        fields["seed"] = seed
    if validation_set is not None:
        fields["validation_data"] = validation_set
    fields["output_fn"] = _forward
    fields["plots"] = "none"  # a worker has no screen: plots.sweep_progress(pool) draws
    execution = {f.name: fields.pop(f.name) for f in dataclasses.fields(ExecutionOptions)
                 if f.name in fields}
    return TrainingOptions(**fields), ExecutionOptions(**execution)


def load_data(spec) -> tuple[Any, Any]:
    """(training set, validation set or None) for a data spec.

    Args:
      spec: "digits" (scikit-learn's digits, embedded); "cifar10" or "tfds:NAME[:SPLIT]"
        (a TFDS set, split "train" by default; "cifar10:test" works too); a folder path
        or ``{"folder": path, "image_size": [h, w]}`` (an ``ImageFolder``, 224 x 224 by
        default); an image set; or ``{"train": spec, "validation": spec | fraction,
        "seed": int}`` where a fraction holds that share of each label out of training.

    Returns:
      Two image sets (uint8 images (N, H, W, C), labels, class names), the second None
      when the spec names no validation data.
    """
    if isinstance(spec, Mapping) and "train" in spec:
        train = _load_one(spec["train"])
        validation = spec.get("validation")
        if isinstance(validation, float):
            train, held_out = train.split_each_label(1.0 - validation, seed=spec.get("seed", 0))
            return train, held_out
        return train, None if validation is None else _load_one(validation)
    return _load_one(spec), None


def _load_one(spec):
    from jaxflowers.data import ImageFolder, digits

    if hasattr(spec, "images") and hasattr(spec, "labels"):
        return spec
    if isinstance(spec, Mapping) and "folder" in spec:
        return ImageFolder(spec["folder"], image_size=tuple(spec.get("image_size",
                                                                              (224, 224))))
    if not isinstance(spec, str):
        raise ValueError(f"data spec {spec!r}: use 'digits', 'cifar10', 'tfds:NAME[:SPLIT]', "
                         "a folder path, {'folder': path, 'image_size': [h, w]} or "
                         "{'train': spec, 'validation': spec}")
    if spec == "digits":
        return digits()
    name, _, split = spec.removeprefix("tfds:").partition(":")
    if spec.startswith("tfds:") or name == "cifar10":
        from jaxflowers.data.tfds import tfds_source

        return tfds_source(name, split or "train")
    if os.path.isdir(spec):
        return ImageFolder(spec)
    raise ValueError(f"data spec {spec!r} is neither a known set ('digits', 'cifar10', "
                     "'tfds:NAME') nor an existing folder")


def build_model(spec: Sequence, *, num_classes: int):
    """The Flax module for a model spec ``(name, kwargs)``.

    Args:
      spec: ``(name, kwargs)`` with name in ``MODELS`` ("cifar_net", "resnet50", ...)
        and the factory's keyword arguments, e.g. ``{"depth": 2}``.
      num_classes: used when ``kwargs`` does not set ``num_classes``.

    Returns:
      ``jaxflowers.models.<name>(**kwargs)``.
    """
    import jaxflowers.models as models

    if isinstance(spec, str):
        spec = (spec, {})
    name, kwargs = spec[0], dict(spec[1] if len(spec) > 1 else {})
    if name not in MODELS:
        raise ValueError(f"model {name!r} is not one of {', '.join(MODELS)}")
    kwargs.setdefault("num_classes", num_classes)
    return getattr(models, name)(**kwargs)
