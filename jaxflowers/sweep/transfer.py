"""What crosses a sweep's process boundary: job references, and values as JSON plus arrays.

A job travels as ``"module:qualname"``, values as JSON with their arrays beside it (``.npy``
arguments, memory-mapped; an ``.npz`` result), never pickled. Only ``TRAVELLING`` classes are
built from a file (``from_dict``), so a file cannot make a process import or call anything else.
"""
from __future__ import annotations

import importlib
import importlib.util
import io
import json
import pathlib
import sys
from typing import Any, Callable, Mapping

import numpy as np

from jaxflowers.host.files import write_atomic

__all__ = ["TRAVELLING", "decode_tree", "encode_tree", "import_for_rebuild", "job_reference",
           "read_arguments", "read_result_bytes", "read_result_files", "rebuild", "resolve_job",
           "write_arguments", "write_result"]

_ARRAY, _TUPLE, _OBJECT = "__array__", "__tuple__", "__object__"
# The classes that travel, by name, and the module each lives in.
TRAVELLING = {"TrainedNet": "jaxflowers.inference.net", "TrainingInfo": "jaxflowers.training.info",
              "TrainingOptions": "jaxflowers.options.training",
              "ExecutionOptions": "jaxflowers.options.execution",
              "ImageSet": "jaxflowers.data.imageset"}

# ---------------------------------------------------------------- job references

def job_reference(fn: Callable | str) -> dict:
    """``{"ref": "module:qualname", "main_path": script or None}`` of a job function; TypeError for
    lambdas, local functions, bound methods, partials and functions of an interactive session."""
    if isinstance(fn, str):
        module, sep, qualname = fn.partition(":")
        if not (sep and module and qualname):
            raise TypeError(f"job reference {fn!r} must look like 'package.module:function'")
        return {"ref": fn, "main_path": None}
    name = getattr(fn, "__qualname__", None)
    module = getattr(fn, "__module__", None)
    hint = ("the worker imports job functions by reference, so define it with `def` at the "
            "top level of an importable module (or pass 'module:function')")
    if not callable(fn) or name is None or module is None:
        raise TypeError(f"{fn!r} is not a function; {hint}")
    if "<lambda>" in name or "<locals>" in name:
        raise TypeError(f"job function {module}.{name} is a lambda or local function; {hint}")
    if _lookup(sys.modules.get(module), name) is not fn:
        raise TypeError(f"job function {fn!r} is not reachable as {module}:{name} "
                        f"(a bound method, partial or decorated copy?); {hint}")
    main_path = None
    if module == "__main__":
        main_path = getattr(sys.modules["__main__"], "__file__", None)
        if main_path is None:
            raise TypeError(f"job function {name} was defined in an interactive session or "
                            f"notebook; {hint}")
    return {"ref": f"{module}:{name}", "main_path": main_path and str(main_path)}


def _lookup(obj: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def resolve_job(ref: str, main_path: str | None = None) -> Callable:
    """Import the job function of ``ref`` ("module:qualname") inside a worker."""
    module_name, _, qualname = ref.partition(":")
    if module_name == "__main__" and main_path:
        spec = importlib.util.spec_from_file_location("__mp_main__", main_path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["__mp_main__"] = module  # as multiprocessing names a re-run script
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    fn = _lookup(module, qualname)
    if not callable(fn):
        raise ImportError(f"job reference {ref!r}: {qualname} not found in {module.__name__}")
    return fn


# ---------------------------------------------------------------- values <-> JSON + arrays

def encode_tree(value: Any, arrays: dict[str, np.ndarray], *, what: str) -> Any:
    """``value`` as JSON-able data, its arrays moved into ``arrays`` (name -> array); TypeError
    naming the path (``what``) of anything but plain values, lists, tuples, str-keyed dicts,
    arrays, ``TRAVELLING`` objects and ``jaxflowers.models`` networks (sent as their spec)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        items = [encode_tree(v, arrays, what=f"{what}[{i}]") for i, v in enumerate(value)]
        return {_TUPLE: items} if isinstance(value, tuple) else items
    if isinstance(value, Mapping):
        bad = [k for k in value if not isinstance(k, str) or k.startswith("__")]
        if bad:
            raise TypeError(f"{what} has dict keys {bad!r}; only str keys not starting with "
                            "'__' travel as JSON")
        return {k: encode_tree(v, arrays, what=f"{what}[{k!r}]") for k, v in value.items()}
    name = _travelling(value)
    if name is not None:
        if name == "ImageFolder":
            value, name = value.load(), "ImageSet"  # the images, not the folder
        plain = _model_plain(value) if name == "Model" else value.to_dict()
        return {_OBJECT: name, "value": encode_tree(plain, arrays, what=f"{what}.{name}")}
    if hasattr(value, "__array__") and hasattr(value, "dtype"):
        return _encode_array(np.asarray(value), arrays, what)
    raise TypeError(f"{what} is a {type(value).__module__}.{type(value).__qualname__}, which "
                    "cannot travel as JSON; pass plain values, numpy arrays, or a file path")


def _travelling(value) -> str | None:
    """The ``TRAVELLING`` name of ``value``'s exact class, "Model" for a network, or None."""
    cls = type(value)
    if cls.__name__ == "ImageFolder" and cls.__module__ == "jaxflowers.data.folder":
        return "ImageFolder"
    if cls.__module__ in ("jaxflowers.models.cifar", "jaxflowers.models.resnet"):
        return "Model"
    return cls.__name__ if TRAVELLING.get(cls.__name__) == cls.__module__ else None


def _model_plain(model) -> dict:
    from jaxflowers.recipes import model_spec

    return {"spec": list(model_spec(model)), "dtype": np.dtype(model.dtype).name}


def _model(plain: dict):
    import jax.numpy as jnp

    from jaxflowers.recipes import build_model

    model = build_model(tuple(plain["spec"]))
    return model.clone(dtype=jnp.bfloat16) if plain["dtype"] == "bfloat16" else model


def _encode_array(array: np.ndarray, arrays: dict, what: str) -> dict:
    if array.dtype.hasobject:
        raise TypeError(f"{what} is an object array, which cannot travel without pickle")
    name = f"a{len(arrays)}"
    if array.dtype.kind == "V" and array.dtype.names is None:  # ml_dtypes: bfloat16, float8...
        arrays[name] = array.astype(np.float32)
        return {_ARRAY: name, "dtype": array.dtype.name}
    arrays[name] = array
    return {_ARRAY: name}


def decode_tree(tree: Any, load: Callable[[str], np.ndarray]) -> Any:
    """Inverse of ``encode_tree`` (objects stay markers for ``rebuild``); ``load(name)``: array."""
    if isinstance(tree, list):
        return [decode_tree(v, load) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if _ARRAY in tree:
        array = load(tree[_ARRAY])
        if "dtype" in tree:
            import ml_dtypes
            array = np.asarray(array).astype(getattr(ml_dtypes, tree["dtype"]))
        return array
    if _TUPLE in tree:
        return tuple(decode_tree(v, load) for v in tree[_TUPLE])
    if _OBJECT in tree:
        return {_OBJECT: tree[_OBJECT], "value": decode_tree(tree["value"], load)}
    return {k: decode_tree(v, load) for k, v in tree.items()}


def import_for_rebuild() -> None:
    """Import what ``rebuild`` needs for the ``TRAVELLING`` classes, JAX and the models
    included (``TrainedNet.from_dict`` builds one), so that a later ``Future.result()`` need
    not wait for it; starts no backend."""
    for module in ("jax.numpy", "jaxflowers.models", *dict.fromkeys(TRAVELLING.values())):
        importlib.import_module(module)


def rebuild(value: Any) -> Any:
    """``value`` with its object markers built (may import JAX); only ``TRAVELLING`` ones."""
    if isinstance(value, (list, tuple)):
        return type(value)(rebuild(v) for v in value)
    if not isinstance(value, dict):
        return value
    if _OBJECT not in value:
        return {k: rebuild(v) for k, v in value.items()}
    name = value[_OBJECT]
    if name == "Model":
        return _model(value["value"])
    if name not in TRAVELLING:
        raise ValueError(f"refusing to rebuild {name!r}: not a jaxflowers class that may travel")
    cls = getattr(importlib.import_module(TRAVELLING[name]), name)
    return cls.from_dict(rebuild(value["value"]))


# ---------------------------------------------------------------- files

def write_arguments(folder: pathlib.Path, args: Any, arrays: dict[str, np.ndarray]) -> None:
    """Store encoded ``args`` as ``args.json`` and each array as ``<name>.npy``."""
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array, allow_pickle=False)
    (folder / "args.json").write_text(json.dumps(args))


def read_arguments(folder: pathlib.Path) -> Any:
    """Load what ``write_arguments`` stored; arrays come back memory-mapped, read-only."""
    tree = json.loads((folder / "args.json").read_text())
    return decode_tree(tree, lambda n: np.load(folder / f"{n}.npy", mmap_mode="r",
                                               allow_pickle=False))


def write_result(folder: pathlib.Path, value: Any) -> None:
    """Store a job's value as ``result.npz``, then ``result.json`` (atomic; JSON = complete)."""
    arrays: dict[str, np.ndarray] = {}
    tree = encode_tree(value, arrays, what="the job's return value")
    write_atomic(folder / "result.npz", lambda file: np.savez(file, **arrays))
    write_atomic(folder / "result.json", json.dumps(tree))


def read_result_bytes(json_text: str, npz_bytes: bytes) -> Any:
    """Decode a result from the two files' contents (objects are left for ``rebuild``)."""
    with np.load(io.BytesIO(npz_bytes), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    return decode_tree(json.loads(json_text), arrays.__getitem__)


def read_result_files(folder: pathlib.Path) -> tuple[str, bytes]:
    return (folder / "result.json").read_text(), (folder / "result.npz").read_bytes()
