"""The stem's max pool (ResNet-50: 3x3, stride 2, over 128 x 112 x 112 x 64 bfloat16), its
forward and backward timed alone, three ways of its backward; each way's gradient is
first checked bit for bit against the XLA phases'.

    python benchmarks/pool_backward.py [--batch 128] [--reps 4] [--rounds 2] [--out F.json]
    python benchmarks/pool_backward.py --check-only --batch 2 [--check-size 16]   # on a CPU
    JAX_PLATFORMS=cpu python benchmarks/pool_backward.py --ptx h100   # jax[cuda12], no GPU

Ways (each with the package's forward, which records each window's first-maximum offset in a
byte):

- ``phases``: ``maxpool.phase_backward``, the package's backward on CPUs: each phase's
  shifted terms summed in XLA, the phases concatenated.
- ``kernel``: ``maxpool.kernel_backward``, the package's backward on GPUs for this pool: one
  Pallas (Triton) kernel writing the four phases of a window row.
- ``masked``: every offset's term added in XLA, broadcast into the interleaved layout under a
  constant mask of its phase, so XLA's fusion holds no concatenation.

``--ptx GPU`` compiles each way for the named GPU on a machine without one (XLA's compile-only
CUDA devices) and counts its kernels' global loads and stores by width: whether they move a
vector (``v4``) or one element at a time. On an H100 the phases' fusion took 0.47 ms in the
step, against about 0.09 ms for its traffic at the memory's rate (``benchmarks/NOTES.md``).
Alone, XLA compiles the forward and backward together, so these figures rank the ways; the
step's own come from ``python -m jaxflowers.bench``.
"""
import argparse
import collections
import functools
import glob
import json
import os
import re
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxflowers.models import maxpool

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import program_time  # noqa: E402

WINDOW, STRIDES, PADDING = (3, 3), (2, 2), ((1, 1), (1, 1))
F32 = jnp.float32


def _masked_backward(window, strides, padding, residuals, dy):
    """The input's gradient as a sum over window offsets k of the phases' shifted term,
    broadcast over the (row, column) phases under a constant one-hot mask of its phase, in
    the phases' order of addition."""
    first, like = residuals
    (kh, kw), (sh, sw) = window, strides
    grid = maxpool._phase_grid(like, strides, padding)
    shape = (dy.shape[0], grid[0], sh, grid[1], sw, dy.shape[3])
    total = jnp.zeros(shape, F32)
    for k in range(kh * kw):
        mask = np.zeros((sh, sw), bool)
        mask[k // kw % sh, k % kw % sw] = True
        spread = lax.broadcast_in_dim(maxpool._chosen_term(first, dy, k, window, strides, grid),
                                      shape, (0, 1, 3, 5))
        total = total + jnp.where(lax.broadcast_in_dim(mask, shape, (2, 4)), spread, 0.0)
    return (maxpool._unpadded(total, like, padding),)


def _way(forward, backward):
    pool = jax.custom_vjp(lambda x, w, s, p: maxpool._max_pool(x, w, s, p),
                          nondiff_argnums=(1, 2, 3))
    pool.defvjp(forward, backward)
    return lambda x: pool(x, WINDOW, STRIDES, PADDING)


def _phases(window, strides, padding, residuals, dy):
    return (maxpool.phase_backward(window, strides, padding, *residuals, dy),)


def _kernel(window, strides, padding, residuals, dy, interpret=None):
    return (maxpool.kernel_backward(residuals[0], dy, residuals[1].dtype,
                                    interpret=interpret),)


WAYS = {
    "phases": _way(maxpool._pool, _phases),
    "kernel": _way(maxpool._pool, _kernel),
    "masked": _way(maxpool._pool, _masked_backward),
}


def inputs(batch, reps, seed=0, size=112):
    """``reps`` ReLU-like bfloat16 inputs (many zeros: windows with tied maxima) and one
    bfloat16 gradient of the output."""
    keys = jax.random.split(jax.random.PRNGKey(seed), reps + 1)
    xs = [jnp.maximum(jnp.round(2 * jax.random.normal(k, (batch, size, size, 64))), 0)
          .astype(jnp.bfloat16) for k in keys[:-1]]
    weights = jax.random.normal(keys[-1], (batch, size // 2, size // 2, 64)).astype(jnp.bfloat16)
    return xs, weights


def _gradients(pool, xs, weights):
    # The output's gradient enters in bfloat16, as in a network: from a float32 loss, XLA
    # would skip the rounding to bfloat16 where it fuses the conversion into the backward.
    return [jax.vjp(pool, x)[1](weights)[0] for x in xs]


def check(batch, size=112):
    """Per way: whether its gradient (and value) equals the phases' bit for bit."""
    xs, weights = inputs(batch, 1, seed=1, size=size)
    expected = jax.jit(functools.partial(_gradients, WAYS["phases"]))(xs, weights)[0]
    found = {}
    for name, pool in WAYS.items():
        got = jax.jit(functools.partial(_gradients, pool))(xs, weights)[0]
        found[name] = bool(jnp.array_equal(got, expected)) and bool(
            jnp.array_equal(pool(xs[0]), WAYS["phases"](xs[0])))
    return found


def ptx_accesses(gpu: str, batch: int) -> dict:
    """Per way, compiled for ``gpu`` ("h100", "h200") without one: each kernel's global
    loads and stores in its PTX, counted by instruction (e.g. ``ld.global.v4.b32``)."""
    import gpu_kernels
    from jax.experimental import topologies

    # compiled for the GPU, not run in the interpreter as on this machine's CPU
    ways = dict(WAYS, kernel=_way(maxpool._pool, functools.partial(_kernel, interpret=False)))
    target = gpu_kernels._TARGET.format(**gpu_kernels.GPUS[gpu])
    device = topologies.get_topology_desc(platform="cuda", target_config=target,
                                          topology="1x1x1").devices[0]
    place = jax.sharding.SingleDeviceSharding(device)
    x = jax.ShapeDtypeStruct((batch, 112, 112, 64), jnp.bfloat16, sharding=place)
    dy = jax.ShapeDtypeStruct((batch, 56, 56, 64), jnp.bfloat16, sharding=place)
    found = {}
    for name, pool in ways.items():
        with tempfile.TemporaryDirectory() as dump:
            jax.jit(lambda x, dy, pool=pool: _gradients(pool, [x], dy)[0]).lower(x, dy).compile(
                compiler_options={"xla_dump_to": dump})
            kernels = {}
            for path in glob.glob(os.path.join(dump, "*.ptx")):
                with open(path) as f:
                    text = f.read()
                for entry, body in re.findall(r"\.entry (\w+)\((.*?)\n}", text, re.S):
                    kernels[entry] = dict(collections.Counter(
                        re.findall(r"\b((?:ld|st)\.global[.\w]*)", body)))
            found[name] = kernels
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--check-size", type=int, default=112,
                        help="the check's input height and width (even)")
    parser.add_argument("--ptx", choices=("h100", "h200"),
                        help="count each way's loads and stores compiled for this GPU instead")
    parser.add_argument("--out", default="pool_backward.json")
    args = parser.parse_args(argv)
    if args.ptx:
        result = {"ptx": ptx_accesses(args.ptx, args.batch)}
        for name, kernels in result["ptx"].items():
            for kernel, counts in sorted(kernels.items()):
                print(f"{name:8s} {kernel:28s} {counts}")
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        return result
    result = {"check": check(args.batch, args.check_size), "rows": []}
    print("equal to the phases', bit for bit:", result["check"], flush=True)
    if not args.check_only:
        xs, weights = inputs(args.batch, args.reps)
        for round_ in range(args.rounds):
            for name, pool in WAYS.items():
                seconds = program_time.per_repetition(
                    functools.partial(_gradients, pool), (xs, weights), args.reps, 1)
                result["rows"].append({"way": name, "round": round_, "ms": 1e3 * seconds})
                print(f"{name:10s} round {round_}: forward + backward {1e3 * seconds:.3f} ms",
                      flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
