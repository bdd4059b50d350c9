"""The time of one repetition inside a compiled program that repeats it ``reps`` times on
distinct inputs, for the kernel micro-benchmarks (``bn_reductions.py``, ``fused_gemm.py``):
compiled and run once first, then the median of ``5 * rounds`` calls, divided by ``reps``.
"""
import statistics
import time


def per_repetition(fn, args, reps, rounds):
    """Seconds per repetition of ``fn(*args)``, which repeats its work ``reps`` times."""
    import jax

    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(5 * rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)
