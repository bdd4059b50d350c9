"""Networks by name: a spec ``(name, kwargs)`` builds a module, and a module gives its spec.

Specs are JSON-able (sweep jobs, saved networks) and build only the networks named here.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["IMAGE_SIZE", "MODELS", "build_model", "model_spec"]

# The image size (height, width) each network is trained at by the recipes.
IMAGE_SIZE = {"cifar_net": (32, 32), "resnet18": (224, 224), "resnet34": (224, 224),
              "resnet50": (224, 224), "resnet101": (224, 224)}
MODELS = (*IMAGE_SIZE, "resnet")  # "resnet": any stage sizes, model_spec's for custom ones
# The keyword arguments a spec may give each network, and their types (tests/test_recipes.py
# checks them against the factories), so a sweep's caller checks a model argument without
# importing the models (and JAX).
_RESNET_ARGUMENTS = {"num_filters": int, "stem": str}
MODEL_ARGUMENTS = {
    "cifar_net": {"depth": int, "width": int, "dense_init": str},
    **{name: _RESNET_ARGUMENTS for name in MODELS if name.startswith("resnet") and
       name != "resnet"},
    "resnet": {"stage_sizes": list, "block": str, **_RESNET_ARGUMENTS},
}


def build_model(spec, num_classes: int | None = None):
    """The Flax module ``jaxflowers.models.<name>(**kwargs)`` of a spec.

    Args:
      spec: a name in ``MODELS``, or ``(name, kwargs)``, e.g. ``("cifar_net", {"depth": 2})``.
      num_classes: outputs, unless ``kwargs`` sets ``num_classes``.
    """
    from jaxflowers import models

    name, kwargs = _split(spec)
    if name not in MODELS:
        raise ValueError(f"model {name!r} is not one of {', '.join(MODELS)}")
    if num_classes is not None:
        kwargs.setdefault("num_classes", int(num_classes))
    if name == "cifar_net":
        kwargs.setdefault("depth", 2)
    try:
        return getattr(models, name)(**kwargs)
    except TypeError as error:
        raise ValueError(f"model {name!r}: {error}") from None


def model_spec(model) -> tuple[str, dict]:
    """The spec that rebuilds ``model`` (dtype and batch-norm axis aside); ``TypeError`` if none."""
    from jaxflowers.models import CifarNet, ResNet
    from jaxflowers.models.resnet import BLOCKS, VARIANTS

    if type(model) is CifarNet:
        kwargs = {"depth": model.depth, "num_classes": model.num_classes}
        if model.dense_init != "glorot_uniform":
            kwargs["dense_init"] = model.dense_init
        if model.width is not None:
            kwargs["width"] = model.width
        return "cifar_net", kwargs
    if type(model) is ResNet:
        block = next(name for name, cls in BLOCKS.items() if cls is model.block_cls)
        kwargs = {"num_classes": model.num_classes}
        if model.num_filters != 64:
            kwargs["num_filters"] = model.num_filters
        if model.stem != "space_to_depth":
            kwargs["stem"] = model.stem
        if model.conv_padding != "same":
            kwargs["conv_padding"] = model.conv_padding
        for name, (sizes, kind) in VARIANTS.items():
            if tuple(model.stage_sizes) == sizes and block == kind:
                return name, kwargs
        return "resnet", {"stage_sizes": list(model.stage_sizes), "block": block, **kwargs}
    raise TypeError(f"{type(model).__module__}.{type(model).__qualname__} is not a network "
                    "of jaxflowers.models, which alone can be named by a spec")


def _split(spec) -> tuple[str, dict[str, Any]]:
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Sequence) and len(spec) in (1, 2) and isinstance(spec[0], str):
        kwargs = spec[1] if len(spec) == 2 else {}
        if isinstance(kwargs, Mapping):
            return spec[0], dict(kwargs)
    raise ValueError(f"model spec {spec!r}: use a name or (name, {{keyword: value}})")
