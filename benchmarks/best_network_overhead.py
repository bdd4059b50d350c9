"""What keeping the best-validation network and the population pass cost: ResNet-50 through
``train`` with validation, alternating in one process between

* ``last``: ``output_network="last-iteration"``, moving statistics (no copy is kept);
* ``best``: ``output_network="best-validation"`` (a copy of the network on the devices at
  every validation dispatch, kept or dropped once its result is read);
* ``best+population``: the same plus the population pass (``train``'s defaults with
  validation data).

    python benchmarks/best_network_overhead.py [--batch 128] [--epochs 3] [--rounds 2]

Prints per run the training loop's time per iteration (``train_time / iterations``,
validation included), the host's wait for validation results, the compile time, and the
time after the loop (choosing the network, the population pass, the final validation);
then the medians' differences against ``last``.
"""
import argparse
import json
import time

import numpy as np

VARIANTS = {"last": ("last-iteration", "moving"), "best": ("best-validation", "moving"),
            "best+population": ("best-validation", "population")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128, help="images per device")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--validation-frequency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--images", type=int, default=3670, help="synthetic images (Flowers: 3670)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--out")
    args = parser.parse_args()

    import jax

    import jaxflowers as jf

    n = len(jax.devices())
    rng = np.random.default_rng(0)
    shape = (args.images, args.image_size, args.image_size, 3)
    data = jf.data.ImageSet(rng.integers(0, 256, shape, dtype=np.uint8),
                            rng.integers(0, 5, args.images), tuple("abcde"))
    train, validation = data.split_each_label(0.9, seed=0)
    shift = (-args.image_size // 7, args.image_size // 7)  # the example's 30 px at 224
    aug = jf.data.Augmentation(reflect_x=True, translate_x=shift, translate_y=shift)
    base = jf.TrainingOptions(solver="adam", mini_batch_size=args.batch * n, augmentation=aug,
                              shuffle="every-epoch", verbose=False, max_epochs=args.epochs,
                              validation_data=validation,
                              validation_frequency=args.validation_frequency)
    rows = []
    for _ in range(args.rounds):
        for name, (output, statistics) in VARIANTS.items():
            opts = base.replace(output_network=output, batch_normalization_statistics=statistics)
            t0 = time.perf_counter()
            _, info = jf.train(train, jf.models.resnet50(5), opts)
            wall = time.perf_counter() - t0
            rows.append({"variant": name, "devices": n, "iterations": len(info.iteration),
                         "validations": len(info.validation_iteration),
                         "iteration_ms": 1e3 * info.train_time / len(info.iteration),
                         "validation_wait_s": info.validation_time,
                         "compile_s": info.compile_time,
                         "after_loop_s": wall - info.compile_time - info.train_time})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    median = {name: {key: np.median([r[key] for r in rows if r["variant"] == name])
                     for key in ("iteration_ms", "compile_s", "after_loop_s")}
              for name in VARIANTS}
    for name in ("best", "best+population"):
        diff = {key: median[name][key] - median["last"][key] for key in median[name]}
        print(f"{name} - last: iteration {diff['iteration_ms']:+.3f} ms "
              f"({100 * diff['iteration_ms'] / median['last']['iteration_ms']:+.2f} %), "
              f"compile {diff['compile_s']:+.2f} s, after the loop {diff['after_loop_s']:+.2f} s")


if __name__ == "__main__":
    main()
