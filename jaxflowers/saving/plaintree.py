"""Values as JSON plus numpy arrays, without pickle: what a sweep job and a saved network hold.

``encode_tree`` turns a tree of plain values, arrays, dtypes and the Flax modules of
``jaxflowers.models`` into JSON-able data: each array is replaced by a
``{"__jaxflowers_array__": name}`` marker and handed back separately (the caller stores
them: ``.npy``, ``.npz``, msgpack), tuples keep their type, and objects travel as
:class:`Tagged` plain trees. Only the classes that ``jaxflowers.models`` exports are ever
rebuilt from a file, so a file cannot make a process import or call anything else.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import enum
import sys
from typing import Any, Callable

import numpy as np

_ARRAY, _TUPLE, _TAG = "__jaxflowers_array__", "__jaxflowers_tuple__", "__jaxflowers_tag__"


@dataclasses.dataclass(frozen=True)
class Tagged:
    """A jaxflowers object as a plain tree, waiting for ``rebuild_tagged``."""

    tag: str
    value: Any


def encode_tree(value: Any, arrays: dict[str, np.ndarray], *, what: str,
                known: Callable[[Any], tuple[str, Any] | None] | None = None) -> Any:
    """``value`` as JSON-able data; arrays move into ``arrays`` and leave a marker.

    Args:
      value: None, bool, int, float, str, lists, tuples, dicts with str keys, numpy or JAX
        arrays and scalars, dtypes, the models of ``jaxflowers.models`` and :class:`Tagged`
        values, nested.
      arrays: filled with name -> numpy array for every array found.
      what: how to name ``value`` in error messages ("argument 'data' of job 3").
      known: turns further objects into ``(tag, plain value)`` (None for the others).

    Returns:
      The JSON-able tree. Raises TypeError naming the offending path otherwise.
    """
    return _encode(value, arrays, what, known or (lambda value: None))


def _encode(value, arrays, path, known):
    if isinstance(value, enum.Enum):  # its value; the field's owner takes it back
        return value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Tagged):
        return {_TAG: value.tag, "value": _encode(value.value, arrays, f"{path}.value", known)}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, arrays, f"{path}[{i}]", known) for i, v in enumerate(value)]
        return {_TUPLE: items} if isinstance(value, tuple) else items
    if isinstance(value, collections.abc.Mapping):
        bad = [k for k in value if not isinstance(k, str) or k.startswith("__jaxflowers_")]
        if bad:
            raise TypeError(f"{path} has dict keys {bad!r}; only str keys travel as JSON")
        return {k: _encode(v, arrays, f"{path}[{k!r}]", known) for k, v in value.items()}
    tagged = known(value) or _encode_object(value)
    if tagged is not None:
        return _encode(Tagged(*tagged), arrays, path, known)
    if hasattr(value, "__array__") and hasattr(value, "dtype"):
        return _encode_array(np.asarray(value), arrays, path)
    raise TypeError(f"{path} is a {type(value).__module__}.{type(value).__qualname__}, which "
                    "cannot travel as JSON; pass plain values, numpy arrays, or a file path")


def _encode_array(array: np.ndarray, arrays: dict, path: str) -> dict:
    if array.dtype.hasobject:
        raise TypeError(f"{path} is an object array, which cannot travel without pickle")
    name = f"a{len(arrays)}"
    if array.dtype.kind == "V" and array.dtype.names is None:  # ml_dtypes: bfloat16, float8...
        arrays[name] = array.astype(np.float32)
        return {_ARRAY: name, "dtype": array.dtype.name}
    arrays[name] = array
    return {_ARRAY: name}


def _decode_array(marker: dict, arrays: Callable[[str], np.ndarray]) -> np.ndarray:
    array = arrays(marker[_ARRAY])
    if "dtype" in marker:
        import ml_dtypes

        array = np.asarray(array).astype(getattr(ml_dtypes, marker["dtype"]))
    return array


def decode_tree(tree: Any, arrays: Callable[[str], np.ndarray]) -> Any:
    """Inverse of :func:`encode_tree`; ``arrays(name)`` loads one array. Tags stay Tagged."""
    if isinstance(tree, list):
        return [decode_tree(v, arrays) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if _ARRAY in tree:
        return _decode_array(tree, arrays)
    if _TUPLE in tree:
        return tuple(decode_tree(v, arrays) for v in tree[_TUPLE])
    if _TAG in tree:
        return Tagged(tree[_TAG], decode_tree(tree["value"], arrays))
    return {k: decode_tree(v, arrays) for k, v in tree.items()}


def rebuild_tagged(value: Any, rebuild: Callable[[str, Any], Any] | None = None) -> Any:
    """Replace every :class:`Tagged` in ``value`` by its object (may import JAX).

    ``rebuild(tag, plain value)`` makes the objects of tags other than this module's own
    ("dtype", "module", "class"); without it such a tag is refused (ValueError).
    """
    if isinstance(value, Tagged):
        inner = rebuild_tagged(value.value, rebuild)
        if value.tag in ("dtype", "module", "class") or rebuild is None:
            return _rebuild_object(value.tag, inner)
        return rebuild(value.tag, inner)
    if isinstance(value, (list, tuple)):
        return type(value)(rebuild_tagged(v, rebuild) for v in value)
    if isinstance(value, dict):
        return {k: rebuild_tagged(v, rebuild) for k, v in value.items()}
    return value


# ---------------------------------------------------------------- dtypes and models

def _model_class(name: str) -> type | None:
    """The class ``jaxflowers.models`` exports as ``name``, or None."""
    models = sys.modules.get("jaxflowers.models")
    if models is None:
        import jaxflowers.models as models
    cls = getattr(models, name, None) if name in models.__all__ else None
    return cls if isinstance(cls, type) else None


def _is_model_class(cls: type) -> bool:
    return cls.__module__.startswith("jaxflowers.models.") and _model_class(cls.__name__) is cls


def _is_dtype(value) -> bool:
    """A numpy or JAX scalar type such as ``np.float32``, ``jnp.float32``, ``jnp.bfloat16``."""
    if not isinstance(value, type):
        return False
    return issubclass(value, np.generic) or isinstance(getattr(value, "dtype", None), np.dtype)


def _encode_object(value: Any) -> tuple[str, Any] | None:
    """(tag, plain fields) for a dtype, a model class or a model, else None."""
    if isinstance(value, type) and _is_model_class(value):
        return "class", {"class": value.__name__}  # e.g. ResNet's block_cls
    if _is_dtype(value):
        return "dtype", {"name": np.dtype(value).name}
    if dataclasses.is_dataclass(value) and not isinstance(value, type) \
            and _is_model_class(type(value)):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                  if f.init and f.name not in ("parent", "name")}
        return "module", {"class": type(value).__name__, "fields": fields}
    return None


def _rebuild_object(tag: str, value: dict) -> Any:
    """The dtype, model class or model that :func:`_encode_object` tagged; ValueError for
    anything else."""
    if tag == "dtype":
        if value["name"] == "bfloat16":
            import ml_dtypes

            return ml_dtypes.bfloat16
        return np.dtype(value["name"]).type
    cls = _model_class(value.get("class", "")) if tag in ("module", "class") else None
    if cls is None:
        raise ValueError(f"refusing to rebuild {tag} {value.get('class')!r}: not a jaxflowers "
                         "class that may travel")
    return cls if tag == "class" else cls(**value["fields"])
