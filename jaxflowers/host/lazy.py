"""Names a package loads on first use (PEP 562), so importing it stays cheap.

``jaxflowers`` and ``jaxflowers.data`` use it: a sweep's caller and the resize cache's
decode processes import them without importing JAX.
"""
from __future__ import annotations

import importlib
from typing import Callable, Mapping, Sequence


def lazy_names(package: str, namespace: dict, exports: Mapping[str, str],
               submodules: Sequence[str] = ()) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package`` whose globals are ``namespace``.

    Args:
      package: the package's ``__name__``.
      namespace: its ``globals()``; a loaded name is stored there, so it loads once.
      exports: name -> the module defining it.
      submodules: subpackage names reachable as attributes.
    """
    names = sorted([*exports, *submodules])

    def __getattr__(name):
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return names

    return __getattr__, __dir__
