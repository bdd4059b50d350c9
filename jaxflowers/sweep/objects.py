"""jaxflowers objects that may cross the process boundary of a sweep, without pickle.

``TrainingOptions`` (with its learning-rate schedules), ``ExecutionOptions``,
``Augmentation`` and image sets (arguments), ``TrainedNet`` and ``TrainingInfo`` (results)
travel as their dataclass fields (the Flax modules of
``jaxflowers.models`` and dtypes are ``jaxflowers.saving.plaintree``'s own). The classes are
named by importing them (:func:`travelling_class`), and an object travels only if its
class *is* one of them, so moving or renaming a class breaks an import the tests run
rather than silently refusing it. Only these classes are ever rebuilt, so a file cannot
make a process import or call anything else. Encoding imports nothing new (the object's
class is loaded already); rebuilding may import JAX: workers do it for arguments, the
caller's ``Future.result()`` for results.
"""
from __future__ import annotations

import dataclasses
from typing import Any

# Learning-rate schedules (``jaxflowers.schedules``) that travel inside TrainingOptions.
_SCHEDULES = ("Constant", "Piecewise", "Warmup", "Cosine", "Polynomial", "Exponential",
              "Cyclical")
# Tags of the dataclasses that travel; ``travelling_class(tag).__name__ == tag``.
TAGS = ("TrainingOptions", "ExecutionOptions", "Augmentation", "ImageSet", "TrainedNet",
        "TrainingInfo", *_SCHEDULES)


def travelling_class(tag: str) -> type:
    """The class that travels as ``tag`` (one of ``TAGS``); imports its module.

    Raises:
      ValueError: for any other tag.
    """
    if tag == "TrainingOptions":
        from jaxflowers.options.training import TrainingOptions as cls
    elif tag == "ExecutionOptions":
        from jaxflowers.options.execution import ExecutionOptions as cls
    elif tag == "Augmentation":
        from jaxflowers.data.augment import Augmentation as cls
    elif tag == "ImageSet":
        from jaxflowers.data.imageset import ImageSet as cls
    elif tag == "TrainedNet":
        from jaxflowers.inference.net import TrainedNet as cls
    elif tag == "TrainingInfo":
        from jaxflowers.training.info import TrainingInfo as cls
    elif tag in _SCHEDULES:
        from jaxflowers import schedules

        cls = getattr(schedules, tag)
    else:
        raise ValueError(f"refusing to rebuild {tag!r}: not a jaxflowers class that may travel")
    return cls


def _travels(cls: type) -> str | None:
    """``cls``'s tag when it is one of the travelling classes itself (no subclass, no
    namesake), else None."""
    tag = cls.__name__
    return tag if tag in TAGS and travelling_class(tag) is cls else None


def encode(value: Any) -> tuple[str, Any] | None:
    """(tag, plain fields) for a jaxflowers dataclass that may travel, else None.

    Raises:
      TypeError: for ``TrainingOptions`` with an ``output_fn`` (a function cannot travel;
        a job's progress reaches the caller through ``report`` and ``after_each``).
    """
    cls = type(value)
    if not cls.__module__.startswith("jaxflowers."):
        return None
    from jaxflowers.data.folder import ImageFolder  # imports no JAX

    if cls is ImageFolder:
        value, cls = value.load(), travelling_class("ImageSet")  # the images, not the folder
    tag = _travels(cls)
    if tag is not None:
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        if fields.get("output_fn") is not None:
            raise TypeError("TrainingOptions.output_fn cannot travel to a worker; report "
                            "progress with jaxflowers.sweep.report and DevicePool.after_each")
        return "dataclass", {"class": tag, "fields": fields}
    return None


def rebuild(tag: str, value: dict) -> Any:
    """The object that :func:`encode` turned into ``(tag, value)``; fields already rebuilt.

    Raises:
      ValueError: for a tag or class outside the fixed list.
    """
    if tag != "dataclass":
        raise ValueError(f"refusing to rebuild {tag} {value.get('class')!r}: not a jaxflowers "
                         "class that may travel")
    return travelling_class(value["class"])(**value["fields"])
