"""JAX's persistent compilation cache: a repeated run loads its XLA executables from disk.

The CLI and sweep jobs turn it on; notebooks call :func:`enable_compilation_cache`. On a GPU
it also holds XLA's autotuning results, which start from the sets that match this
installation (``autotune.py``)."""
from __future__ import annotations

import os
import warnings

__all__ = ["CACHE_ENV", "enable_compilation_cache"]

CACHE_ENV = "JAXFLOWERS_COMPILE_CACHE"  # a folder, or "off"


def enable_compilation_cache(path: str | os.PathLike | None = None, *,
                             min_compile_time_s: float = 0.5) -> str | None:
    """Turn on JAX's persistent compilation cache for this process.

    Args:
      path: the folder; default ``$JAXFLOWERS_COMPILE_CACHE`` (``off``: no cache), else
        ``xla/`` in the jaxflowers cache folder.
      min_compile_time_s: programs that compiled faster than this are not stored.

    Returns:
      The folder in use, or None when off or unwritable (then a warning; the cache is optional).
      Sets of autotuning results that match this GPU stack are copied in (``autotune.seed``).
    """
    import jax

    from jaxflowers.compilation import autotune
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
    xla_caches = jax.config.jax_persistent_cache_enable_xla_caches or ""
    if xla_caches == "all" or autotune.FOLDER in xla_caches:  # JAX points XLA at it
        try:
            autotune.seed(folder)
        except OSError as error:  # a full disk: XLA times its candidates itself
            warnings.warn(f"could not copy autotuning results into {folder}: {error}",
                          stacklevel=2)
    return folder
