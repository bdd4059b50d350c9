"""XLA compiler options for jaxflowers' own programs, given per ``jax.jit`` so other JAX code
is untouched; an option named in ``XLA_FLAGS`` is left to the user. ``jax.pmap`` takes none,
so ``strategy="pmap"`` compiles with XLA's defaults.
"""
from __future__ import annotations

import functools
import os

__all__ = ["DEFAULTS", "OFF_ENV", "compiler_options"]

# Both are XLA:GPU debug options; XLA:CPU accepts and ignores them. Why off: they cost compile
# time, and a step's one all-reduce comes after the whole backward pass (no latency to hide).
DEFAULTS = {
    "xla_gpu_enable_latency_hiding_scheduler": False,
    "xla_gpu_experimental_enable_fusion_autotuner": False,
}
OFF_ENV = "JAXFLOWERS_XLA_DEFAULTS"  # "off": compile with XLA's own defaults


@functools.cache
def compiler_options() -> dict:
    """``DEFAULTS`` less those in ``XLA_FLAGS`` or unknown to this XLA; {} when turned off."""
    if os.environ.get(OFF_ENV, "").lower() == "off":
        return {}
    flags = os.environ.get("XLA_FLAGS", "")
    options = {name: value for name, value in DEFAULTS.items() if name not in flags}
    if not options:
        return {}
    import jax
    import numpy as np
    try:
        # Checked on the host's backend where there is one: a GPU's first compile would
        # start its compiler on the main thread, before the programs that need it.
        try:
            probe = jax.device_put(np.float32(0), jax.devices("cpu")[0])
        except RuntimeError:  # JAX_PLATFORMS without "cpu"
            probe = np.float32(0)
        jax.jit(lambda x: x + 1, compiler_options=options).lower(probe).compile()
    except Exception:  # an XLA without one of them: its defaults, rather than no training
        return {}
    return options
