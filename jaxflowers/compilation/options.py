"""XLA compiler options for jaxflowers' own programs (init, training block, forward pass).

Per program (``jax.jit(..., compiler_options=...)``), so other JAX code in the process is
untouched, and never against the user: an option named in ``XLA_FLAGS`` is left to it.
(``strategy="pmap"`` programs compile with XLA's defaults: ``jax.pmap`` takes no options.)

Why these two: XLA's latency-hiding scheduler runs on each of the thousands of candidate
modules GPU autotuning compiles, about half of a cold ResNet-50 compile's CPU time, and
with the fusion autotuner off too the compile needs about half the CPU time, with the step
unchanged (``benchmarks/NOTES.md``, "Compile time"). The one all-reduce of a multi-GPU
step comes after the whole backward pass, so there is no latency to hide.
"""
from __future__ import annotations

import functools
import os

# Both are XLA:GPU debug options; XLA:CPU accepts and ignores them.
DEFAULTS = {
    "xla_gpu_enable_latency_hiding_scheduler": False,
    "xla_gpu_experimental_enable_fusion_autotuner": False,
}
OFF_ENV = "JAXFLOWERS_XLA_DEFAULTS"  # "off": compile with XLA's own defaults


@functools.cache
def compiler_options() -> dict:
    """The options for ``jax.jit``: ``DEFAULTS`` less those named in ``XLA_FLAGS`` and any
    this XLA does not know (checked once by compiling a one-line program); {} when
    ``$JAXFLOWERS_XLA_DEFAULTS=off``."""
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
