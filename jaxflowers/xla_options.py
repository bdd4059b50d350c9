"""XLA compiler options for jaxflowers' own programs (init, training block, forward pass).

Per program (``jax.jit(..., compiler_options=...)``), so other JAX code in the process is
untouched, and never against the user: an option named in ``XLA_FLAGS`` is left to it.
(``strategy="pmap"`` programs compile with XLA's defaults: ``jax.pmap`` takes no options.)

Measured on an H200 host (16 cores, jax 0.11.2; benchmarks/NOTES.md, session 6): a trace of
ResNet-50's cold block compile showed XLA's latency-hiding scheduler run on each of ~2,500
autotuning candidate modules, 41 of the compile's 88 CPU-seconds. Without it and without
the fusion autotuner the block compiled with 36 instead of 71-80 CPU-seconds, and the
10-epoch MATLAB example's cold compile (init, block and validation at once) took 12.0 / 12.2
instead of 16.5 / 15.2 s; the 1-GPU step took 18.63-18.77 ms with them and 18.65-18.69 ms
without (separate processes, within their run-to-run spread). The one all-reduce of a
multi-GPU step comes after the whole backward pass, so there is no latency to hide.
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
