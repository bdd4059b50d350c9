"""What the divergence check costs a step: ResNet-50 through ``train`` with the check as
shipped and with its gradient reduction replaced by a constant (the loss check, a scalar,
stays), alternating in one process.

    python benchmarks/finite_check_overhead.py [--batch 128] [--rounds 2]

The check reduces the all-reduced gradient once per step (``step._all_finite``) and selects
the new or the old state inside the update's own kernels. Prints each run's median step
time (``bench.measure``: synchronised windows after warm-up) and the difference.
"""
import argparse
import json

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128, help="images per device")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    import jaxflowers as jf
    from jaxflowers import bench
    from jaxflowers.training import step

    n = len(jax.devices())
    rng = np.random.default_rng(0)
    data = jf.data.ImageSet(rng.integers(0, 256, (3670, 224, 224, 3), dtype=np.uint8),
                            rng.integers(0, 5, 3670), tuple("abcde"))
    aug = jf.data.Augmentation(reflect_x=True, translate_x=(-30, 30), translate_y=(-30, 30))
    opts = jf.TrainingOptions(solver="adam", mini_batch_size=args.batch * n, augmentation=aug,
                              shuffle="every-epoch", verbose=False)
    shipped = getattr(step, "_all_finite", None)  # None: a version without the check
    rows = []
    for _ in range(args.rounds):
        for check in (True, False):
            step._all_finite = shipped if check else (lambda tree: jnp.bool_(True))
            row = bench.measure(data, jf.models.resnet50(5), opts, window_steps=20, windows=5)
            rows.append({"gradient_check": check, "step_ms": 1e3 * row["step_s"],
                         "images_per_s": row["images_per_s"], "devices": n})
            print(json.dumps(rows[-1]), flush=True)
    step._all_finite = shipped
    on = np.median([r["step_ms"] for r in rows if r["gradient_check"]])
    off = np.median([r["step_ms"] for r in rows if not r["gradient_check"]])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"step with the check {on:.3f} ms, without {off:.3f} ms: "
          f"{on - off:+.3f} ms ({100 * (on - off) / off:+.2f} %)")


if __name__ == "__main__":
    main()
