"""Would a 1x1 convolution that applies batch norm and ReLU to its input while it loads it,
and sums its output's batch-norm statistics while it stores it, beat XLA's three kernels?

    python benchmarks/fused_gemm.py [--rounds 2] [--reps 8] [--out FILE.json]
    python benchmarks/fused_gemm.py --interpret   # small shapes on a CPU, correctness only

ResNet-50's bottlenecks are 1x1 convolutions (matrix products over M = N*H*W rows) between
batch norms. XLA runs each as three kernels: the previous batch norm's apply and ReLU (reads
the activation, writes it back), cuBLAS's product (reads it again), and the next batch
norm's sums (reads the product's output). A Pallas (Triton) kernel can do all three in one:
that is what MLPerf's fused kernels do. Ways, per shape of ResNet-50 at 128 images:

- ``xla``: the three kernels, as the model runs them now;
- ``xla-gemm``: XLA's product alone (the floor for ``xla``);
- ``pallas-gemm:BM:BN:BK:WARPS:STAGES``: a Pallas product alone, to see how near cuBLAS it is;
- ``pallas-fused:...``: the Pallas product with the apply in its prologue and the sums in its
  epilogue (partial sums per row block, summed by XLA after).

Each program runs ``--reps`` products on distinct inputs; the time is per product, the
median of ``5 * --rounds`` calls. The forward pass only: if the fused kernel does not win
here, its backward (two products, each with the ReLU mask and batch norm's sums) will not.
"""
import argparse
import functools
import json
import statistics
import sys
import time

import numpy as np

# (M, K, N): the 1x1 convolutions of ResNet-50's four stages at 128 images of 224 px.
SHAPES = [(401408, 256, 64), (401408, 64, 256), (100352, 512, 128), (100352, 128, 512),
          (25088, 1024, 256), (25088, 256, 1024), (6272, 2048, 512), (6272, 512, 2048)]
SMALL = [(256, 64, 32), (512, 32, 64)]
CONFIGS = [(128, 64, 64, 4, 3), (128, 128, 64, 4, 3), (128, 128, 64, 8, 3),
           (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (64, 64, 64, 4, 4)]


def xla_chain(x, w, p):
    """The model's three kernels: apply + ReLU, the product, the output's two sums."""
    import jax.numpy as jnp

    z = jnp.maximum(x.astype(jnp.float32) * p[0] + p[1], 0.0).astype(jnp.bfloat16)
    o = jnp.dot(z, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
    of = o.astype(jnp.float32)
    return o, jnp.stack([of.sum(0), jnp.square(of).sum(0)])


def xla_gemm(x, w, p):
    import jax.numpy as jnp

    del p
    return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)


def pallas_product(x, w, p, *, config, fused, interpret=False):
    """``x @ w`` in one Pallas kernel; ``fused``: ``relu(x * p[0] + p[1]) @ w`` and the
    output's column sums of ``o`` and ``o**2``, as ``xla_chain`` returns them."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    bm, bn, bk, warps, stages = config
    m, k = x.shape
    n = w.shape[1]
    grid = (m // bm, n // bn)

    def kernel(x_ref, w_ref, p_ref, o_ref, *sums):
        def body(i, acc):
            cols = pl.ds(i * bk, bk)
            a = x_ref[:, cols]
            if fused:
                a = jnp.maximum(a.astype(jnp.float32) * p_ref[0, cols][None, :]
                                + p_ref[1, cols][None, :], 0.0).astype(jnp.bfloat16)
            return acc + jnp.dot(a, w_ref[cols, :], preferred_element_type=jnp.float32)

        acc = jax.lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), jnp.float32))
        o = acc.astype(jnp.bfloat16)
        o_ref[...] = o
        if fused:
            of = o.astype(jnp.float32)
            sums[0][...] = of.sum(0)
            sums[1][...] = (of * of).sum(0)

    o_shape = jax.ShapeDtypeStruct((m, n), jnp.bfloat16)
    o_spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
    out_shape, out_specs = [o_shape], [o_spec]
    if fused:
        part = jax.ShapeDtypeStruct((grid[0] * n,), jnp.float32)
        part_spec = pl.BlockSpec((bn,), lambda i, j: (i * grid[1] + j,))
        out_shape += [part, part]
        out_specs += [part_spec, part_spec]
    outs = pl.pallas_call(
        kernel, out_shape=out_shape, grid=grid, out_specs=out_specs,
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                  pl.BlockSpec((2, k), lambda i, j: (0, 0))],
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages),
        interpret=interpret, name="fused_gemm" if fused else "gemm")(x, w, p)
    if not fused:
        return outs[0]
    sums = jnp.stack([outs[1].reshape(grid[0], n).sum(0), outs[2].reshape(grid[0], n).sum(0)])
    return outs[0], sums


def inputs(shape, reps, seed=0):
    import jax
    import jax.numpy as jnp

    m, k, n = shape
    keys = jax.random.split(jax.random.PRNGKey(seed), 2 * reps + 2)
    xs = [jax.random.normal(keys[i], (m, k), jnp.bfloat16) for i in range(reps)]
    w = (jax.random.normal(keys[-2], (k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
    scale = 1.0 + 0.1 * jax.random.normal(keys[-1], (k,), jnp.float32)
    p = jnp.stack([scale, jnp.full((k,), 0.1, jnp.float32)])
    return xs, w, p


def check(shape, config, interpret):
    """Largest differences of the fused kernel's output and sums from ``xla_chain``'s,
    relative to the largest magnitude of each."""
    import jax
    import jax.numpy as jnp

    xs, w, p = inputs(shape, 1, seed=1)
    o, s = jax.jit(xla_chain)(xs[0], w, p)
    fo, fs = jax.jit(functools.partial(pallas_product, config=config, fused=True,
                                       interpret=interpret))(xs[0], w, p)
    f32 = jnp.float32
    rel_o = float(jnp.abs(fo.astype(f32) - o.astype(f32)).max() / jnp.abs(o.astype(f32)).max())
    rel_s = float(jnp.abs(fs - s).max() / jnp.abs(s).max())
    return rel_o, rel_s


def time_way(fn, args, reps, rounds):
    import jax

    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(5 * rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def measure(shape, reps, rounds):
    """Rows for one shape: each way's time per product, with every Pallas configuration."""
    xs, w, p = inputs(shape, reps)
    m, k, n = shape
    flops = 2 * m * k * n

    def many(one):
        return lambda *xs_: [one(x, w, p) for x in xs_]

    rows = []
    ways = [("xla", None, xla_chain), ("xla-gemm", None, xla_gemm)]
    for config in CONFIGS:
        if m % config[0] or config[1] > n or config[2] > k:
            continue
        for fused in (False, True):
            name = "pallas-fused" if fused else "pallas-gemm"
            ways.append((name, config, functools.partial(pallas_product, config=config,
                                                         fused=fused)))
    for name, config, one in ways:
        try:
            t = time_way(many(one), xs, reps, rounds)
        except Exception as error:  # a configuration Triton cannot compile: say so, go on
            rows.append({"shape": list(shape), "way": name, "config": config,
                         "error": f"{type(error).__name__}: {str(error)[:200]}"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        rows.append({"shape": list(shape), "way": name, "config": config, "us": 1e6 * t,
                     "TFLOP_per_s": flops / t / 1e12})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _fastest(rows, way):
    found = [r for r in rows if r["way"] == way]
    return min(found, key=lambda r: r["us"]) if found else None


def table(rows):
    """Per shape: XLA's chain, XLA's product, the best Pallas product and fused kernel."""
    print("| M, K, N | xla chain us | xla product us | best pallas product us | "
          "best pallas fused us | fused / chain |")
    print("|---|---|---|---|---|---|")
    for shape in sorted({tuple(r["shape"]) for r in rows}, key=lambda s: -s[0]):
        mine = [r for r in rows if tuple(r["shape"]) == shape and "us" in r]

        chain, gemm, pg, pf = (_fastest(mine, w) for w in ("xla", "xla-gemm", "pallas-gemm",
                                                          "pallas-fused"))

        def cell(r):
            if r is None:
                return "-"
            return f"{r['us']:.1f}" + (f" {tuple(r['config'])}" if r["config"] else "")

        ratio = f"{pf['us'] / chain['us']:.2f}" if pf and chain else "-"
        print(f"| {shape} | {cell(chain)} | {cell(gemm)} | {cell(pg)} | {cell(pf)} | {ratio} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--interpret", action="store_true",
                        help="run the kernels in Pallas' interpreter on small shapes and "
                             "only check them against XLA's")
    parser.add_argument("--out", help="write the rows here as JSON")
    args = parser.parse_args(argv)

    shapes = SMALL if args.interpret else SHAPES
    checks = []
    for shape in shapes:
        config = (64, 32, 32, 4, 2) if args.interpret else CONFIGS[1]
        rel_o, rel_s = check(shape, config, args.interpret)
        checks.append({"shape": list(shape), "config": config, "rel_output": rel_o,
                       "rel_sums": rel_s})
        print(json.dumps(checks[-1]), flush=True)
    rows = [] if args.interpret else [r for s in shapes for r in measure(s, args.reps,
                                                                         args.rounds)]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"checks": checks, "rows": rows}, f, indent=1)
    if rows:
        table(rows)
    return 0 if all(c["rel_output"] < 2e-2 and c["rel_sums"] < 2e-2 for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
