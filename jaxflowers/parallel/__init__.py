"""The devices a run uses and the one wrapping of per-device functions over them
(``DataParallel``: ``shard_map`` or ``pmap`` over a 1-D ``"data"`` mesh), and the
scaling of batch and learning rate to them."""
import warnings

import lazy_loader

_getattr, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "data_parallel": ["AXIS", "REPLICATED", "DataParallel", "select_devices", "sharded"],
    "scaling": ["scale_for_devices"]})


def __getattr__(name):
    if name == "initialize":  # the README's old path, kept for one release
        warnings.warn("jaxflowers.parallel.initialize is now jaxflowers.distributed.initialize",
                      DeprecationWarning, stacklevel=2)
        from jaxflowers.distributed import initialize
        return initialize
    return _getattr(name)
