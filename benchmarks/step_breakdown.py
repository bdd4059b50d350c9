"""Where a ResNet-50 step's time goes: the recipe against variants without augmentation,
with SGDM instead of Adam, and without L2, each timed like ``python -m jaxflowers.bench``.

    python benchmarks/step_breakdown.py [--devices 1] [--batch 128] [--out step_breakdown.json]
"""
import argparse
import json

import jaxflowers as jf
from jaxflowers.bench import measure, synthetic_set


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--batch", type=int, default=128, help="per device")
    parser.add_argument("--out", default="step_breakdown.json")
    args = parser.parse_args()
    data = synthetic_set(3670, 224, 5)
    aug = jf.data.Augmentation(reflect_x=True, translate_x=(-30, 30), translate_y=(-30, 30))
    variants = [("adam+aug", dict(solver="adam", augmentation=aug)),
                ("adam noaug", dict(solver="adam")),
                ("sgdm noaug", dict(solver="sgdm")),
                ("sgdm noaug nol2", dict(solver="sgdm", l2_regularization=0.0))]
    rows = []
    for tag, kwargs in variants:
        opts = jf.TrainingOptions(mini_batch_size=args.batch * args.devices,
                                  shuffle="every-epoch", **kwargs)
        row = measure(data, jf.models.resnet50(5), opts, window_steps=20, windows=4,
                      execution=jf.ExecutionOptions(num_devices=args.devices))
        rows.append(dict(row, tag=tag))
        print(f"{tag:18s} {row['images_per_s']:8.0f} img/s  step {1000 * row['step_s']:.2f} ms"
              f"  compile {row['compile_s']:.1f} s", flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
