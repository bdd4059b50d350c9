"""Does ``ResNet(fused_1x1=True)`` (batch norm folded into the 1x1 convolutions' Pallas
kernels, ``jaxflowers.models.fused_1x1``) make the ResNet-50 step faster? The example's
recipe (Adam, reflection and +-30 px translation, bfloat16 on GPUs), timed as
``python -m jaxflowers.bench`` times it, plain and fused in turn; before that, one step's
loss and gradients of the two on the same batch.

    python benchmarks/fused_step.py [--batches 128 256] [--rounds 2] [--out fused_step.json]
    python benchmarks/fused_step.py --check-only --batches 8 --image-size 64   # a CPU check
"""
import argparse
import contextlib
import json
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from jaxflowers.bench import BenchSettings, config_options, measure, parse_model, synthetic_set
from jaxflowers.bench.scaling import environment
from jaxflowers.models.resnet import BottleneckBlock

WAYS = ("plain", "fused", "expand")


def _models(spec, ways=WAYS[:2]):
    """``expand``: the fused network with its reducing 1x1 convolutions plain (the expanding
    ones alone fused)."""
    plain = spec.build()
    return {way: plain if way == "plain" else plain.clone(fused_1x1=True) for way in ways}


@contextlib.contextmanager
def _ways_reduce(way):
    """While training ``way``: for ``expand``, bottleneck blocks reduce with a plain 1x1."""
    saved = BottleneckBlock._reduce
    if way == "expand":
        BottleneckBlock._reduce = lambda self, x: self.norm(relu=True, name="BatchNorm_0")(
            self.conv(self.filters, (1, 1), name="Conv_0")(x))
    try:
        yield
    finally:
        BottleneckBlock._reduce = saved


def check(spec, batch: int, image_size: int) -> dict:
    """One step's loss and gradients, fused against plain, on one random batch in bfloat16:
    the largest difference of each leaf relative to its largest magnitude."""
    models = {k: m.clone(dtype=jnp.bfloat16) for k, m in _models(spec).items()}
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, image_size, image_size, 3))
    labels = jnp.arange(batch) % spec.num_classes
    variables = models["plain"].init(jax.random.PRNGKey(0), x[:1], train=False)

    def loss_and_grads(model):
        def loss(params):
            logits, _ = model.apply({"params": params, "batch_stats": variables["batch_stats"]},
                                    x, train=True, mutable=["batch_stats"])
            return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(batch), labels])
        return jax.jit(jax.value_and_grad(loss))(variables["params"])

    (plain_loss, plain_grads), (fused_loss, fused_grads) = map(loss_and_grads, models.values())
    rel = [float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max() /
                 jnp.abs(b.astype(jnp.float32)).max())
           for a, b in zip(jax.tree.leaves(fused_grads), jax.tree.leaves(plain_grads))
           if jnp.abs(b).max() > 0]
    return {"batch": batch, "image_size": image_size, "loss": [float(plain_loss),
                                                               float(fused_loss)],
            "gradient_worst": max(rel), "gradient_median": statistics.median(rel)}


def _write(path, result):
    with open(path, "w") as f:  # after every row: a run cut short keeps what it measured
        json.dump(result, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS[:2]))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--window-steps", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=None, help="(default: 224)")
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--out", default="fused_step.json")
    args = parser.parse_args()
    spec = parse_model("resnet50")
    size = args.image_size or spec.image_size
    result = {"environment": environment(), "checks": [], "rows": []}
    result["checks"].append(check(spec, args.batches[0], size))
    print("check:", json.dumps(result["checks"][-1]), flush=True)
    if not args.check_only:
        data = synthetic_set(max(3670, 4 * max(args.batches)), size, spec.num_classes)
        for batch in args.batches:
            options = config_options(spec, BenchSettings(per_device_batch=batch),
                                     strategy="shard_map", scaling="weak", devices=1, largest=1)
            for round_ in range(args.rounds):
                for way, model in _models(spec, args.ways).items():
                    with _ways_reduce(way):
                        row = measure(data, model, options, window_steps=args.window_steps,
                                      windows=args.windows)
                    result["rows"].append(dict(row, way=way, batch=batch, round=round_))
                    print(f"batch {batch} {way:5s} round {round_}: "
                          f"{row['images_per_s']:7.0f} images/s, step "
                          f"{1e3 * row['step_s']:.2f} ms, compile {row['compile_s']:.1f} s",
                          flush=True)
                    _write(args.out, result)
    _write(args.out, result)
    print(f"\n{'batch':>5} {'way':>6} {'images/s':>9} {'/plain':>7}  (median over rounds)")
    for batch in args.batches:
        rates = {way: statistics.median(r["images_per_s"] for r in result["rows"]
                                        if r["batch"] == batch and r["way"] == way)
                 for way in args.ways if any(r["batch"] == batch and r["way"] == way
                                             for r in result["rows"])}
        for way, rate in rates.items():
            ratio = f"{rate / rates['plain']:7.3f}" if "plain" in rates else ""
            print(f"{batch:5d} {way:>6} {rate:9.0f} {ratio}")


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
