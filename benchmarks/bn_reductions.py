"""Batch norm's per-channel reductions on the GPU: how fast XLA's kernels read the
activations, and whether other ways of summing are faster, alone and in whole training steps.

    python benchmarks/bn_reductions.py [--micro] [--steps] [--rounds 2] [--ways WAY ...]
        [--out FILE.json]

Ways: "one" as ``models/norm.py`` sums (one reduction over N, H, W); in two stages ("image":
per image first; "rows": per image row first); "wide:W", k rows side by side as one row of
k * C <= W values, then the k partial rows; "pallas:TILE:WARPS", the Pallas (Triton) kernels
of ``bn_kernels.py`` (a program per block of TILE elements). ``--micro``: each activation
shape of ResNet-50 (128 images, 224 px) and of the sweep's networks, the forward statistics
(sums of x and x**2) and the backward sums (of ``dy`` and ``dy * xhat`` behind the ReLU
mask); time per reduction from 16 of them in one program, and the bytes read per second.
``--steps``: ``bench.measure`` of ResNet-50 (128 images, Adam, the Flowers augmentation) and
the sweep's depths 3 and 4 with ``models.norm`` summing each way, in one process.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bn_kernels, also when safe-path

RESNET = [(128, 112, 112, 64), (128, 56, 56, 64), (128, 56, 56, 256), (128, 28, 28, 128),
          (128, 28, 28, 512), (128, 14, 14, 256), (128, 14, 14, 1024), (128, 7, 7, 512),
          (128, 7, 7, 2048)]
CIFAR = [(128, 32, 32, 8), (128, 32, 32, 16), (128, 16, 16, 24), (128, 8, 8, 40),
         (128, 16, 16, 16), (128, 8, 8, 32)]
WAYS = ("one", "image", "rows", "wide:512", "wide:1024", "wide:2048", "pallas:8192:4",
        "pallas:16384:4", "pallas:16384:8", "pallas:32768:8")


def _kernel(way):
    """``channel_sums``' keyword arguments for a "pallas:TILE:WARPS" way."""
    _, tile, warps = way.split(":")
    return {"impl": "pallas", "tile": int(tile), "warps": int(warps)}


def _split(xf, way):
    """``xf`` (N, H, W, C) float32 viewed as (groups, per group, C) for a two-stage sum."""
    n, h, w, c = xf.shape
    return {"image": xf.reshape(n, h * w, c), "rows": xf.reshape(n * h, w, c)}[way]


def _fold(m, c, width):
    """The largest power of two k dividing ``m`` with k * c <= ``width`` (at least 1)."""
    k = 1
    while m % (2 * k) == 0 and 2 * k * c <= width:
        k *= 2
    return k


def channel_sums(values, way):
    """Sums over every axis but the last of each (N, H, W, C) float32 array, stacked.

    "wide:W" sums k rows side by side as one row of k * C <= W values (a column reduction
    with a wide minor axis), then the k partial rows."""
    import jax.numpy as jnp

    if way == "one":
        return jnp.stack([v.sum((0, 1, 2)) for v in values])
    if way.startswith("wide:"):
        c = values[0].shape[-1]
        m = values[0].size // c
        k = _fold(m, c, int(way[5:]))
        return jnp.stack([v.reshape(m // k, k * c).sum(0).reshape(k, c).sum(0) for v in values])
    return jnp.stack([_split(v, way).sum(1) for v in values]).sum(1)


def patch(way):
    """Make ``models.norm`` reduce ``way``; returns nothing (the module is changed in place)."""
    import bn_kernels as cs
    import jax.numpy as jnp
    from jax import lax

    from jaxflowers.models import norm

    def stats(x, axis_name):
        xf = x.astype(norm.F32)
        count = x.size // x.shape[-1]
        if way.startswith("pallas"):
            moments = cs.moments(x, **_kernel(way)) / count
        else:
            moments = channel_sums([xf, jnp.square(xf)], way) / count
        if axis_name is not None:
            moments = lax.pmean(moments, axis_name)
        mean, mean2 = moments[0], moments[1]
        return mean, jnp.maximum(mean2 - jnp.square(mean), 0.0)

    def backward(epsilon, axis_name, relu, residuals, cotangents):
        x, mean, rstd, scale, bias = residuals
        dy = cotangents[0].astype(norm.F32)
        xhat = (x.astype(norm.F32) - mean) * rstd
        if relu:
            dy = jnp.where(xhat * scale + bias > 0, dy, 0.0)
        count = x.size // x.shape[-1]
        if way.startswith("pallas"):
            sums = cs.grad_sums(cotangents[0], x, mean, rstd, scale, bias, relu, **_kernel(way))
        else:
            sums = channel_sums([dy, dy * xhat], way)
        dscale, dbias = sums[1], sums[0]
        if axis_name is not None:
            sums = lax.psum(sums, axis_name)
            count = count * lax.psum(1, axis_name)
        dx = (scale * rstd / count) * (count * dy - sums[0] - xhat * sums[1])
        return dx.astype(x.dtype), dscale, dbias

    norm._stats = stats
    norm.batch_norm_train.defvjp(norm._normalize, backward)


def micro(rounds, ways):
    import bn_kernels as cs
    import jax
    import jax.numpy as jnp
    import program_time

    reps, rows = 16, []
    key = jax.random.PRNGKey(0)
    for shape in RESNET + CIFAR:
        x = jax.random.normal(key, (reps, *shape), jnp.bfloat16)
        dy = jax.random.normal(jax.random.PRNGKey(1), (reps, *shape), jnp.bfloat16)
        c = shape[-1]
        mean, rstd = jnp.zeros((c,), jnp.float32), jnp.ones((c,), jnp.float32)
        scale, bias = jnp.ones((c,), jnp.float32), jnp.zeros((c,), jnp.float32)
        for way in ways:
            def fwd(x, way=way):
                out = []
                for i in range(reps):
                    if way.startswith("pallas"):
                        out.append(cs.moments(x[i], **_kernel(way)))
                        continue
                    xf = x[i].astype(jnp.float32)
                    out.append(channel_sums([xf, jnp.square(xf)], way))
                return jnp.stack(out)

            def bwd(x, dy, way=way, params=(mean, rstd, scale, bias)):
                mean, rstd, scale, bias = params
                out = []
                for i in range(reps):
                    if way.startswith("pallas"):
                        out.append(cs.grad_sums(dy[i], x[i], mean, rstd, scale, bias, True,
                                                **_kernel(way)))
                        continue
                    xhat = (x[i].astype(jnp.float32) - mean) * rstd
                    d = jnp.where(xhat * scale + bias > 0, dy[i].astype(jnp.float32), 0.0)
                    out.append(channel_sums([d, d * xhat], way))
                return jnp.stack(out)

            for name, fn, args, read in (("forward", fwd, (x,), 1), ("backward", bwd, (x, dy), 2)):
                t = program_time.per_repetition(fn, args, reps, rounds)
                nbytes = read * int(np.prod(shape)) * 2
                rows.append({"part": "micro", "shape": list(shape), "pass": name, "way": way,
                             "us": 1e6 * t, "GB_per_s": nbytes / t / 1e9})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def steps(rounds, ways):
    import jax

    import jaxflowers as jf
    from jaxflowers import bench, recipes
    from jaxflowers.models import norm

    original = (norm._stats, norm._backward)
    rng = np.random.default_rng(0)
    cifar = jf.data.ImageSet(rng.integers(0, 256, (45000, 32, 32, 3), dtype=np.uint8),
                             rng.integers(0, 10, 45000), tuple("abcdefghij"))
    flowers = jf.data.ImageSet(rng.integers(0, 256, (2560, 224, 224, 3), dtype=np.uint8),
                               rng.integers(0, 5, 2560), tuple("abcde"))
    cifar_opts = jf.TrainingOptions(solver="sgdm", mini_batch_size=128, verbose=False,
                                    augmentation=recipes.augmentation("sweep"),
                                    shuffle="every-epoch")
    flowers_opts = jf.TrainingOptions(solver="adam", mini_batch_size=128, verbose=False,
                                      augmentation=recipes.augmentation("flowers"),
                                      shuffle="every-epoch")
    configs = [("cifar_net:3", lambda: jf.models.cifar_net(3), cifar, cifar_opts, 256),
               ("cifar_net:4", lambda: jf.models.cifar_net(4), cifar, cifar_opts, 256),
               ("resnet50", lambda: jf.models.resnet50(5), flowers, flowers_opts, 20)]
    rows = []
    for round_ in range(rounds):
        for way in ways:
            norm._stats = original[0]
            norm.batch_norm_train.defvjp(norm._normalize, original[1])
            if way != "one":
                patch(way)
            for name, make, data, opts, window in configs:
                jax.clear_caches()
                row = bench.measure(data, make(), opts, window_steps=window, windows=5)
                rows.append({"part": "steps", "round": round_, "model": name, "way": way,
                             "step_ms": 1e3 * row["step_s"], "compile_s": row["compile_s"]})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--micro", action="store_true")
    parser.add_argument("--steps", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    parser.add_argument("--out")
    args = parser.parse_args()
    import jax
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    rows = (micro(args.rounds, args.ways) if args.micro else []) + (
        steps(args.rounds, args.ways) if args.steps else [])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    table = {}
    for r in rows:
        if r["part"] == "micro":
            table.setdefault((tuple(r["shape"]), r["pass"]), {})[r["way"]] = r["us"]
    for (shape, pas), ways in table.items():
        print(f"{'x'.join(map(str, shape)):>18} {pas:>8} " + "  ".join(
            f"{w} {ways[w]:7.1f}" for w in WAYS if w in ways))
    by = {}
    for r in rows:
        if r["part"] == "steps":
            by.setdefault((r["model"], r["way"]), []).append(r["step_ms"])
    for (model, way), ms in by.items():
        print(f"{model:>12} {way:>6} step ms " + " / ".join(f"{m:.3f}" for m in ms))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
