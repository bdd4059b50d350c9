"""Mismatches between training data, validation data and model, refused before compiling
(rather than a meaningless accuracy at the end). Every message names both sides."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxflowers.data.feed import image_shape

__all__ = ["check_training", "model_outputs"]

_MODELS = "jaxflowers.models."


def check_training(data, model, options) -> None:
    """Raise ``ValueError`` unless ``data``, ``model`` and ``options`` can train together.

    Checks: at least two classes; validation classes and image shape as training feeds them;
    a model with one output per class.
    """
    classes = tuple(str(c) for c in data.class_names)
    _check_classes(np.asarray(data.labels), classes)
    shape = image_shape(data)
    fed = options.augmentation.output_shape(shape) if options.augmentation else shape
    if options.validation_data is not None:
        _check_validation(options.validation_data, classes, fed)
    outputs = model_outputs(model, fed)
    if outputs != len(classes):
        raise ValueError(f"the model has {outputs} outputs but the training data has "
                         f"{len(classes)} classes {_names(classes)}; build the model with "
                         f"num_classes={len(classes)}")


def model_outputs(model, input_shape: Sequence[int]) -> int:
    """How many logits ``model`` gives per image of ``input_shape`` (H, W, C).

    ``jaxflowers.models`` declare it (``num_classes``), sparing a trace; others are traced
    with ``jax.eval_shape``.
    """
    declared = getattr(model, "num_classes", None)
    ours = any(cls.__module__.startswith(_MODELS) for cls in type(model).__mro__)
    if ours and isinstance(declared, int):
        return declared
    import jax
    import jax.numpy as jnp

    def logits(image):
        return model.init_with_output(jax.random.PRNGKey(0), image, train=False)[0]

    out = jax.eval_shape(logits, jax.ShapeDtypeStruct((1, *input_shape), jnp.float32))
    if len(out.shape) != 2 or out.shape[0] != 1:
        raise ValueError(f"the model maps one image of shape {tuple(input_shape)} to "
                         f"{out.shape}; it must give (1, num_classes) logits")
    return int(out.shape[1])


def _check_classes(labels: np.ndarray, classes: tuple[str, ...]) -> None:
    if len(classes) < 2:
        raise ValueError(f"the training data has {len(classes)} class {_names(classes)}; a "
                         "classifier needs at least 2 (one folder per class)")
    present = np.unique(labels)
    if len(present) < 2:
        held = tuple(classes[i] for i in present)
        raise ValueError(f"the training data holds images of {len(present)} of its "
                         f"{len(classes)} classes {_names(held)}; a classifier needs images "
                         "of at least 2")


def _check_validation(validation, classes: tuple[str, ...], fed: tuple[int, ...]) -> None:
    theirs = tuple(str(c) for c in validation.class_names)
    if theirs != classes:
        if sorted(theirs) == sorted(classes):
            detail = "the same names in another order, so label i would mean another class"
        else:
            missing, extra = set(classes) - set(theirs), set(theirs) - set(classes)
            detail = "; ".join(filter(None, (
                missing and f"it lacks {_names(sorted(missing))}",
                extra and f"training lacks {_names(sorted(extra))}")))
        raise ValueError(f"validation_data classes {_names(theirs)} differ from the training "
                         f"data's {_names(classes)}: {detail}")
    shape = image_shape(validation)
    if shape != tuple(fed):
        raise ValueError(f"validation_data images are {shape} but training feeds the network "
                         f"{tuple(fed)} (the training images after any random_crop); give "
                         "validation images of that shape")


def _names(names: Sequence[str], most: int = 6) -> str:
    """``('a', 'b')``, cut after ``most`` names: ``('a', 'b', ... 10 in all)``."""
    shown = ", ".join(repr(n) for n in list(names)[:most])
    return f"({shown}, ... {len(names)} in all)" if len(names) > most else f"({shown})"
