"""Compiled programs kept on disk between runs: JAX's persistent compilation cache.

A second run of the same training (same model, shapes, options, devices and JAX version)
loads its XLA executables, GPU autotuning included, instead of compiling them again. The
CLI and the sweep's jobs turn it on; in a notebook, call :func:`enable_compilation_cache`
before the first ``train``.
"""
from __future__ import annotations

import os
import warnings

CACHE_ENV = "JAXFLOWERS_COMPILE_CACHE"  # a folder, or "off"


def enable_compilation_cache(path: str | os.PathLike | None = None, *,
                             min_compile_time_s: float = 0.5) -> str | None:
    """Turn on JAX's persistent compilation cache for this process.

    Args:
      path: the cache folder; default ``$JAXFLOWERS_COMPILE_CACHE``, else ``xla/`` in the
        jaxflowers cache folder (``$JAXFLOWERS_CACHE_DIR`` or ``~/.cache/jaxflowers``).
        ``$JAXFLOWERS_COMPILE_CACHE=off`` leaves the cache off.
      min_compile_time_s: programs that compiled faster than this are not stored.

    Returns:
      The folder in use, or None when switched off by the environment or when the folder
      cannot be written: the cache is optional, so that is a warning naming the folder,
      and the run goes on compiling everything.
    """
    import jax

    from jaxflowers.data.cache import default_cache_dir
    from jaxflowers.host.files import unwritable

    setting = os.environ.get(CACHE_ENV, "")
    if path is None and setting.lower() == "off":
        return None
    folder = os.path.abspath(os.path.expanduser(
        str(path or setting or os.path.join(default_cache_dir(), "xla"))))
    problem = unwritable(folder)
    if problem:
        warnings.warn(f"compilation cache folder {folder} cannot be written ({problem}); going "
                      f"on without the cache (set {CACHE_ENV} to another folder, or to off)",
                      stacklevel=2)
        return None
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
