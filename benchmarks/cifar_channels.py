"""The sweep's networks computed on padded channels: ``cifar_net(depth, channel_multiple=m)``
trained through ``train`` on 45,000 synthetic 32x32 images (SGDM, the sweep's augmentation,
128 images), each depth and multiple in turn, rounds alternating in one process.

    python benchmarks/cifar_channels.py [--depths 1 2 3 4] [--multiples 1 8 16] [--rounds 2]

Multiple 1 computes on MATLAB's widths (depth 3: 9/18/36 channels, which cuDNN pads for its
tensor cores in every convolution); 8 and 16 round each layer's channels up with zeros, so the
network, its stored weights and its gradients are the same. Prints each run's median step
(``bench.measure``) and, per depth, the median over rounds.
"""
import argparse
import json
import statistics

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--out")
    args = parser.parse_args()

    import jax

    import jaxflowers as jf
    from jaxflowers import bench, recipes

    rng = np.random.default_rng(0)
    data = jf.data.ImageSet(rng.integers(0, 256, (45000, 32, 32, 3), dtype=np.uint8),
                            rng.integers(0, 10, 45000), tuple("abcdefghij"))
    opts = jf.TrainingOptions(solver="sgdm", mini_batch_size=args.batch, verbose=False,
                              augmentation=recipes.augmentation("sweep"),
                              shuffle="every-epoch")
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
    rows = []
    for round_ in range(args.rounds):
        for depth in args.depths:
            for multiple in args.multiples:
                model = jf.models.cifar_net(depth, channel_multiple=multiple)
                row = bench.measure(data, model, opts, window_steps=256, windows=5)
                rows.append({"round": round_, "depth": depth, "channel_multiple": multiple,
                             "step_ms": 1e3 * row["step_s"], "compile_s": row["compile_s"],
                             "images_per_s": row["images_per_s"]})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print("depth | " + " | ".join(f"multiple {m} ms" for m in args.multiples))
    for depth in args.depths:
        cells = [statistics.median(r["step_ms"] for r in rows
                                   if r["depth"] == depth and r["channel_multiple"] == m)
                 for m in args.multiples]
        print(f"{depth} | " + " | ".join(f"{c:.3f}" for c in cells))


if __name__ == "__main__":
    main()
