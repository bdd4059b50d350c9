"""The devices a run uses and the one wrapping of per-device functions over them
(``DataParallel``: ``shard_map`` or ``pmap`` over a 1-D ``"data"`` mesh)."""
import warnings

from jaxflowers.host.lazy import lazy_names

_EXPORTS = {name: "jaxflowers.parallel.data_parallel" for name in (
    "AXIS", "REPLICATED", "DataParallel", "select_devices", "sharded")}
__all__ = sorted(_EXPORTS)

_getattr, __dir__ = lazy_names(__name__, globals(), _EXPORTS)


def __getattr__(name):
    if name == "initialize":  # the README's old path, kept for one release
        warnings.warn("jaxflowers.parallel.initialize is now jaxflowers.distributed.initialize",
                      DeprecationWarning, stacklevel=2)
        from jaxflowers.distributed import initialize
        return initialize
    return _getattr(name)
