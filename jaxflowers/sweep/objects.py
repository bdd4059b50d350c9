"""jaxflowers objects that may cross the process boundary of a sweep, without pickle.

``TrainingOptions``, ``Augmentation`` and image sets (arguments), ``TrainedNet`` and
``TrainingInfo`` (results) travel as their dataclass fields; the Flax modules of
``jaxflowers.models`` as their class and fields. Only the classes listed here (and modules
of ``jaxflowers.models``) are ever rebuilt, so a file cannot make a process import or call
anything else. Encoding needs no import (the object exists already); rebuilding imports
the class's module, which may import JAX: workers do it for arguments, and the caller's
``Future.result()`` for results.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any

DATACLASSES = frozenset({
    "jaxflowers.options:TrainingOptions", "jaxflowers.data.augment:Augmentation",
    "jaxflowers.data.imageset:ImageSet", "jaxflowers.net:TrainedNet",
    "jaxflowers.info:TrainingInfo",
    *(f"jaxflowers.schedules:{name}" for name in ("Constant", "Piecewise", "Warmup", "Cosine",
                                                  "Polynomial", "Exponential", "Cyclical"))})
_IMAGE_SETS = frozenset({"jaxflowers.data.folder:ImageFolder"})  # loaded, then an ImageSet
_MODELS = "jaxflowers.models."


def class_ref(cls: type) -> str:
    """"module:qualname" of a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


def encode(value: Any) -> tuple[str, Any] | None:
    """(tag, plain fields) for a jaxflowers object that may travel, else None.

    Raises:
      TypeError: for ``TrainingOptions`` with an ``output_fn`` (a function cannot travel;
        a job's progress reaches the caller through ``report`` and ``after_each``).
    """
    if isinstance(value, type) and class_ref(value).startswith(_MODELS):
        return "class", {"class": class_ref(value)}  # e.g. ResNet's block_cls
    ref = class_ref(type(value))
    if ref in _IMAGE_SETS and hasattr(value, "load"):
        value, ref = value.load(), "jaxflowers.data.imageset:ImageSet"
    if ref in DATACLASSES:
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        if fields.get("output_fn") is not None:
            raise TypeError("TrainingOptions.output_fn cannot travel to a worker; report "
                            "progress with jaxflowers.sweep.report and DevicePool.after_each")
        return "dataclass", {"class": ref, "fields": fields}
    if ref.startswith(_MODELS) and dataclasses.is_dataclass(value):
        return "module", {"class": ref, "fields": _module_fields(value)}
    if _is_dtype(value):
        import numpy as np

        return "dtype", {"name": np.dtype(value).name}
    return None


def _module_fields(module) -> dict:
    return {f.name: getattr(module, f.name) for f in dataclasses.fields(module)
            if f.init and f.name not in ("parent", "name")}


def _is_dtype(value) -> bool:
    """A numpy or JAX scalar type such as ``np.float32``, ``jnp.float32``, ``jnp.bfloat16``."""
    import numpy as np

    if not isinstance(value, type):
        return False
    return issubclass(value, np.generic) or isinstance(getattr(value, "dtype", None), np.dtype)


def rebuild(tag: str, value: dict) -> Any:
    """The object that :func:`encode` turned into ``(tag, value)``; fields already rebuilt.

    Raises:
      ValueError: for a tag or class outside the fixed list.
    """
    if tag == "dtype":
        import numpy as np

        if value["name"] == "bfloat16":
            import ml_dtypes

            return ml_dtypes.bfloat16
        return np.dtype(value["name"]).type
    ref = value["class"]
    allowed = ref in DATACLASSES if tag == "dataclass" else (
        tag in ("module", "class") and ref.startswith(_MODELS))
    if not allowed:
        raise ValueError(f"refusing to rebuild {tag} {ref!r}: not a jaxflowers class that "
                         "may travel")
    module, _, name = ref.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls if tag == "class" else cls(**value["fields"])
