"""How jobs, their arguments and their results cross process boundaries, without pickle.

A job function travels as a reference ``"module:qualname"`` that the worker imports.
Arguments and results travel as JSON with their arrays beside it (``jaxflowers.saving.plaintree``),
as ``.npy`` files (arguments, memory-mapped by the worker) or one ``.npz`` (results),
always with ``allow_pickle=False``. Tuples keep their type (a job returning a tuple has
several outputs, like a MATLAB function with several output arguments). jaxflowers objects
(``TrainingOptions``, image sets, ``TrainedNet``, ``TrainingInfo``; the models through
``plaintree``) travel as ``Tagged`` plain trees that ``objects.rebuild`` turns back into
objects, from a fixed list of classes, never from a name the file could choose freely.
"""
from __future__ import annotations

import importlib
import importlib.util
import io
import json
import pathlib
import sys
from typing import Any, Callable

import numpy as np

from jaxflowers.saving import plaintree
from jaxflowers.sweep import objects

Tagged, decode_tree = plaintree.Tagged, plaintree.decode_tree  # the sweep's names for them

# ---------------------------------------------------------------- job references

def job_reference(fn: Callable | str) -> dict:
    """The importable reference of a job function, checked at submit time.

    Args:
      fn: a function defined at the top level of a module (or of the running script), or
        a string ``"module:qualname"``.

    Returns:
      ``{"ref": "module:qualname", "main_path": str | None}``; ``main_path`` is the script
      a ``__main__`` function comes from (the worker loads it as ``__mp_main__``).

    Raises:
      TypeError: for lambdas, nested or local functions, bound methods, partials and
        functions of an interactive session, which a worker cannot import.
    """
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
    """Import the job function named by ``ref`` ("module:qualname") inside a worker."""
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


# ---------------------------------------------------------------- trees <-> JSON + arrays

def encode_tree(value: Any, arrays: dict[str, np.ndarray], *, what: str) -> Any:
    """``plaintree.encode_tree`` that also lets the sweep's objects travel (``objects``)."""
    return plaintree.encode_tree(value, arrays, what=what, known=objects.encode)


def rebuild_tagged(value: Any) -> Any:
    """``plaintree.rebuild_tagged`` that also rebuilds the sweep's objects (may import JAX)."""
    return plaintree.rebuild_tagged(value, objects.rebuild)


# ---------------------------------------------------------------- files

def write_arguments(folder: pathlib.Path, args: Any, arrays: dict[str, np.ndarray]) -> None:
    """Store encoded ``args`` as ``args.json`` and each array as ``<name>.npy`` in ``folder``."""
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array, allow_pickle=False)
    (folder / "args.json").write_text(json.dumps(args))


def read_arguments(folder: pathlib.Path) -> Any:
    """Load what :func:`write_arguments` stored; arrays come back memory-mapped, read-only."""
    tree = json.loads((folder / "args.json").read_text())
    return decode_tree(tree, lambda n: np.load(folder / f"{n}.npy", mmap_mode="r",
                                               allow_pickle=False))


def write_result(folder: pathlib.Path, value: Any) -> None:
    """Store a job's return value as ``result.json`` + ``result.npz`` (atomic: json last)."""
    arrays: dict[str, np.ndarray] = {}
    tree = encode_tree(value, arrays, what="the job's return value")
    with open(folder / "result.npz", "wb") as f:
        np.savez(f, **arrays)
    tmp = folder / "result.json.tmp"
    tmp.write_text(json.dumps(tree))
    tmp.replace(folder / "result.json")


def read_result_bytes(json_text: str, npz_bytes: bytes) -> Any:
    """Decode a result from the two files' contents (Tagged values are left for later)."""
    with np.load(io.BytesIO(npz_bytes), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    return decode_tree(json.loads(json_text), arrays.__getitem__)


def read_result_files(folder: pathlib.Path) -> tuple[str, bytes]:
    """The raw contents of ``result.json`` and ``result.npz`` in ``folder``."""
    return (folder / "result.json").read_text(), (folder / "result.npz").read_bytes()
