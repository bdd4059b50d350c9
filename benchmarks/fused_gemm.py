"""Would 1x1 convolutions that fold batch norm into their loads and stores beat XLA's chain
of kernels in ResNet-50's step?

    python benchmarks/fused_gemm.py [--rounds 2] [--reps 8] [--out FILE.json]
    python benchmarks/fused_gemm.py --interpret   # small shapes on a CPU, correctness only
    python benchmarks/fused_gemm.py --bound       # the most such kernels could save a step
    python benchmarks/fused_gemm.py --lower       # lowered for CUDA without a GPU: errors
    python benchmarks/fused_gemm.py --table FILE.json   # an --out file's table again

ResNet-50's bottlenecks are 1x1 convolutions (matrix products over M = N*H*W rows) between
batch norms. Forward, XLA runs each as three kernels: the previous batch norm's apply and
ReLU (reads the activation, writes it back), cuBLAS's product (reads it again), and the
next batch norm's sums (reads the product's output). Backward: the input-gradient product,
the ReLU mask and batch norm's two sums over it (a pass over the gradient and the
activation), the apply recomputed for the kernel-gradient product, that product, and the
input gradient's elementwise pass. MLPerf's kernels fold these passes into the products;
so do ``gemm_kernels.py``'s Pallas (Triton) kernels. Ways, per 1x1 shape of ResNet-50 at
128 images of 224 px:

- ``forward`` / ``backward``: XLA's chain, as the model runs it;
- ``forward-products`` / ``backward-products``: XLA's products alone (cuBLAS), the floor;
- ``pallas-product``: a Pallas product alone, to see how near cuBLAS Triton gets;
- ``pallas-forward`` / ``pallas-backward``: the fused kernels (and, backward, XLA's last
  elementwise pass), one per configuration ``(R, C, S, warps, stages)``.

Each program runs ``--reps`` layers on distinct inputs; a time is per layer, the median of
``5 * --rounds`` calls. Before timing, the fused kernels' outputs are checked against XLA's.
"""
import argparse
import functools
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gemm_kernels, when safe-path

# ResNet-50's stages at 224 px: blocks, bottleneck width, first block's input size, size.
STAGES = [(3, 64, 56, 56), (4, 128, 56, 28), (6, 256, 28, 14), (3, 512, 14, 7)]
BATCH = 128
# (M, K, N): each stage's reducing and expanding 1x1 convolution at BATCH images.
SHAPES = [(BATCH * size ** 2, k, n) for _, mid, _, size in STAGES
          for k, n in ((4 * mid, mid), (mid, 4 * mid))]
SMALL = [(256, 64, 32), (512, 32, 64)]
SMALL_CONFIG = (64, 32, 32, 4, 2)
CONFIGS = [(128, 64, 64, 4, 3), (128, 128, 64, 4, 3), (128, 128, 64, 8, 3),
           (128, 256, 64, 8, 3), (64, 64, 64, 4, 4)]


def traffic_saved(batch=BATCH, three_by_three=False):
    """Elements of memory traffic per ResNet-50 step (224 px) that fused kernels would save:
    every 1x1 output's forward sums (the output's read); the expanding 1x1's input, whose
    apply would no longer be written and read forward, nor its batch norm's sums read
    backward. The reducing 1x1 reads the block's input, kept for the residual anyway.
    ``three_by_three``: the 3x3 convolutions fused the same way too (input and output)."""
    total = 0
    for blocks, mid, first_size, own_size in STAGES:
        for block in range(blocks):
            reduce_rows = batch * (first_size if block == 0 else own_size) ** 2
            rows = batch * own_size ** 2
            total += reduce_rows * mid  # the reducing 1x1's sums
            total += 4 * rows * mid + rows * 4 * mid  # the expanding 1x1: apply, sums; its sums
            if block == 0:
                total += rows * 4 * mid  # the projection's sums
            if three_by_three:
                total += 4 * reduce_rows * mid + rows * mid  # the 3x3's apply, sums; its sums
    return total


def inputs(shape, reps, seed=0):
    """``reps`` activations (M, K) and output gradients (M, N), a kernel (K, N) and batch
    norm's (4, K) mean, reciprocal deviation, scale and offset."""
    import jax
    import jax.numpy as jnp

    m, k, n = shape
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 2 * reps + 4))
    xs = [jax.random.normal(next(keys), (m, k), jnp.bfloat16) for _ in range(reps)]
    dos = [jax.random.normal(next(keys), (m, n), jnp.bfloat16) for _ in range(reps)]
    w = (jax.random.normal(next(keys), (k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
    p = jnp.stack([0.1 * jax.random.normal(next(keys), (k,), jnp.float32),
                   jnp.full((k,), 1.1, jnp.float32),
                   1.0 + 0.1 * jax.random.normal(next(keys), (k,), jnp.float32),
                   jnp.full((k,), 0.1, jnp.float32)])
    return xs, dos, w, p


def _relative(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def check(shape, config, interpret):
    """The largest difference of each output of the fused kernels from XLA's, relative to the
    largest magnitude of that output of XLA's."""
    import gemm_kernels as gk
    import jax

    xs, dos, w, p = inputs(shape, 1, seed=1)
    expected = jax.jit(gk.forward_chain)(xs[0], w, p)
    found = jax.jit(functools.partial(gk.pallas_forward, config=config, fused=True,
                                      interpret=interpret))(xs[0], w, p)
    row = {"shape": list(shape), "config": list(config),
           "forward": [_relative(f, e) for f, e in zip(found, expected)]}
    expected = jax.jit(gk.backward_chain)(xs[0], dos[0], w, p)
    found = jax.jit(functools.partial(gk.pallas_backward, config=config,
                                      interpret=interpret))(xs[0], dos[0], w, p)
    row["backward"] = [_relative(f, e) for f, e in zip(found, expected)]
    return row


def _ways(shape):
    import gemm_kernels as gk

    m, k, n = shape
    ways = [("forward", None, gk.forward_chain), ("forward-products", None, gk.product),
            ("backward", None, gk.backward_chain),
            ("backward-products", None, gk.backward_products)]
    seen = set()
    for config in CONFIGS:
        clamped = (min(config[0], m), min(config[1], n, k), *config[2:])
        if clamped in seen:
            continue
        seen.add(clamped)
        ways += [("pallas-product", config,
                  functools.partial(gk.pallas_forward, config=config, fused=False)),
                 ("pallas-forward", config,
                  functools.partial(gk.pallas_forward, config=config, fused=True)),
                 ("pallas-backward", config,
                  functools.partial(gk.pallas_backward, config=config))]
    return ways


def measure(shape, reps, rounds):
    """Rows for one shape: each way's time per layer."""
    import program_time

    xs, dos, w, p = inputs(shape, reps)
    m, k, n = shape
    rows = []
    for name, config, one in _ways(shape):
        backward = "backward" in name
        if backward:
            def many(*args, one=one):
                return [one(x, do, w, p) for x, do in zip(args[:reps], args[reps:])]
            args = [*xs, *dos]
        else:
            def many(*args, one=one):
                return [one(x, w, p) for x in args]
            args = xs
        row = {"shape": list(shape), "way": name, "config": config}
        try:
            t = program_time.per_repetition(many, args, reps, rounds)
        except Exception as error:  # a configuration Triton cannot compile: say so, go on
            row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
        else:
            products = 2 if backward else 1
            row.update(us=1e6 * t, TFLOP_per_s=products * 2 * m * k * n / t / 1e12)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def lower_all(shapes):
    """Lower every way of ``shapes`` for CUDA, on any machine: Triton's lowering errors show
    without a GPU. Returns the number lowered and the errors."""
    import jax
    import jax.numpy as jnp

    lowered, errors = 0, []
    for shape in shapes:
        m, k, n = shape
        x, do = (jax.ShapeDtypeStruct((m, c), jnp.bfloat16) for c in (k, n))
        w = jax.ShapeDtypeStruct((k, n), jnp.bfloat16)
        p = jax.ShapeDtypeStruct((4, k), jnp.float32)
        for name, config, one in _ways(shape):
            args = (x, do, w, p) if "backward" in name else (x, w, p)
            try:
                jax.jit(one).trace(*args).lower(lowering_platforms=("cuda",))
            except Exception as error:  # report every one, not just the first
                errors.append(f"{shape} {name} {config}: {type(error).__name__}: {error}")
            else:
                lowered += 1
    return lowered, errors


def _fastest(rows, way):
    found = [r for r in rows if r["way"] == way and "us" in r]
    return min(found, key=lambda r: r["us"]) if found else None


def _per_pass(rows):
    """Per shape (largest M first) and pass: the fastest row of XLA's chain and products and
    of the plain and fused Pallas kernels (None where a way has no time)."""
    for shape in sorted({tuple(r["shape"]) for r in rows}, key=lambda s: -s[0]):
        mine = [r for r in rows if tuple(r["shape"]) == shape]
        for direction in ("forward", "backward"):
            yield shape, direction, {
                "chain": _fastest(mine, direction),
                "products": _fastest(mine, f"{direction}-products"),
                "plain": _fastest(mine, "pallas-product") if direction == "forward" else None,
                "fused": _fastest(mine, f"pallas-{direction}")}


def table(rows):
    """Per shape and direction: XLA's chain and products, the best Pallas kernels."""
    print("| M, K, N | pass | XLA chain us | XLA products us | best Pallas product us | "
          "best Pallas fused us | fused / chain |")
    print("|---|---|---|---|---|---|---|")

    def cell(r):
        if r is None:
            return "-"
        return f"{r['us']:.1f}" + (f" {tuple(r['config'])}" if r["config"] else "")

    for shape, direction, best in _per_pass(rows):
        chain, fused = best["chain"], best["fused"]
        ratio = f"{fused['us'] / chain['us']:.2f}" if fused and chain else "-"
        print(f"| {shape} | {direction} | {cell(chain)} | {cell(best['products'])} "
              f"| {cell(best['plain'])} | {cell(fused)} | {ratio} |")


def step_estimate(rows):
    """Milliseconds a ResNet-50 step (128 images) spends in its 1x1 convolutions, forward and
    backward, each way: every shape weighted by its stage's block count (the first block's
    reducing 1x1 counted at its stage's shape, the projection left out). ``best`` takes, per
    shape and pass, the faster of XLA's chain and the fused kernels."""
    blocks = {BATCH * size ** 2: count for count, _, _, size in STAGES}
    total = dict.fromkeys(("chain", "products", "fused", "best"), 0.0)
    for shape, direction, best in _per_pass(rows):
        if not (best["chain"] and best["products"] and best["fused"]):
            raise ValueError(f"{shape} {direction}: a way has no time")
        us = {key: best[key]["us"] for key in ("chain", "products", "fused")}
        us["best"] = min(us["chain"], us["fused"])
        for key in total:
            total[key] += blocks[shape[0]] * us[key] / 1e3
    return total


def _write(path, checks, rows):
    if path:
        with open(path, "w") as f:
            json.dump({"checks": checks, "rows": rows}, f, indent=1)


def _report(rows):
    table(rows)
    if {tuple(r["shape"]) for r in rows} == set(SHAPES):
        step = step_estimate(rows)
        print("A step's 1x1 convolutions, ms: " + ", ".join(
            f"{key} {ms:.2f}" for key, ms in step.items())
            + f"; saved {step['chain'] - step['fused']:.2f} all fused, "
            f"{step['chain'] - step['best']:.2f} the faster of each")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--shapes", type=int, nargs="+", metavar="I",
                        help="time only these of SHAPES (0-based; default: all)")
    parser.add_argument("--interpret", action="store_true",
                        help="run the kernels in Pallas' interpreter on small shapes and "
                             "only check them against XLA's")
    parser.add_argument("--out", help="write the checks and rows here as JSON")
    parser.add_argument("--lower", action="store_true",
                        help="lower every way of the shapes for CUDA (no GPU needed), "
                             "report the errors, then stop")
    parser.add_argument("--bound", action="store_true",
                        help="print the traffic fused 1x1 kernels would save a step, and "
                             "what it is worth at 3 and 4 TB/s, then stop")
    parser.add_argument("--table", metavar="FILE.json",
                        help="print the table and the step's estimate of an --out file, "
                             "then stop")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            _report(json.load(f)["rows"])
        return 0
    if args.bound:
        for which, three in (("the 1x1 convolutions", False), ("and the 3x3 too", True)):
            saved = 2 * traffic_saved(three_by_three=three)  # bfloat16 bytes
            print(f"ResNet-50, 128 images, {which}: {saved / 1e9:.2f} GB a step fewer; "
                  f"{saved / 3e12 * 1e3:.2f} ms at 3 TB/s, {saved / 4e12 * 1e3:.2f} ms at 4 TB/s")
        return 0

    shapes = SMALL if args.interpret else [SHAPES[i] for i in args.shapes or range(len(SHAPES))]
    if args.lower:
        lowered, errors = lower_all(shapes)
        print("\n".join(errors + [f"lowered {lowered} programs, {len(errors)} failed"]))
        return 1 if errors else 0
    config = SMALL_CONFIG if args.interpret else CONFIGS[1]
    checks = [check(shape, config, args.interpret) for shape in shapes]
    for row in checks:
        print(json.dumps(row), flush=True)
    rows = []
    for shape in [] if args.interpret else shapes:
        rows += measure(shape, args.reps, args.rounds)
        _write(args.out, checks, rows)  # each shape's rows kept if a later one runs too long
    _write(args.out, checks, rows)
    if rows:
        _report(rows)
    worst = max(max(c["forward"] + c["backward"]) for c in checks)
    return 0 if worst < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
