"""The ResNet-50 forward pass in inference with the stem's max pool as strided slices (what
validation, ``predict`` and the exports run) against ``lax.reduce_window``.

    python benchmarks/inference_pool.py [--batch 256] [--repeats 20]

One process, bfloat16, random weights; each variant compiled once, then timed over
``--repeats`` calls after a warm-up (median). Prints ms per batch and images/s, and the
largest difference between the two outputs.
"""
import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxflowers as jf
from jaxflowers.models import maxpool


def _reduce_window(x, window, strides, padding):
    pads = ((0, 0), *padding, (0, 0))
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, *window, 1), (1, *strides, 1), pads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    model = jf.models.resnet50(num_classes=102, dtype=jnp.bfloat16)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(args.batch, 224, 224, 3)),
                    jnp.bfloat16)
    variables = jax.jit(lambda: model.init(jax.random.key(0), x[:1], train=False))()
    sliced = maxpool._sliced_max
    rows, outputs = [], {}
    for name, pool in (("strided slices", sliced), ("reduce_window", _reduce_window)):
        maxpool._sliced_max = pool  # traced below, so each variant compiles its own program
        forward = jax.jit(lambda v, images: model.apply(v, images, train=False))
        out = forward(variables, x).block_until_ready()
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            forward(variables, x).block_until_ready()
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        outputs[name] = np.asarray(out, np.float32)
        rows.append({"pool": name, "ms": 1e3 * median, "images_per_s": args.batch / median})
        print(json.dumps(rows[-1]), flush=True)
    maxpool._sliced_max = sliced
    difference = float(np.abs(outputs["strided slices"] - outputs["reduce_window"]).max())
    print(f"{'pool':16s} {'ms/batch':>9s} {'images/s':>9s}   (batch {args.batch}, "
          f"{jax.devices()[0].device_kind}; outputs differ by at most {difference:g})")
    for r in rows:
        print(f"{r['pool']:16s} {r['ms']:9.2f} {r['images_per_s']:9,.0f}")


if __name__ == "__main__":
    main()
