"""What checkpoints cost a training: the MATLAB Flowers example's recipe with and without a
checkpoint every N epochs, and how long each save held the training loop.

    python benchmarks/checkpoint_overhead.py DATA [--epochs 20] [--every 10] [--out FILE]

DATA: a folder of class folders (``benchmarks/synthetic_folders.py flowers DEST`` writes
one the size of Flowers). Both runs share the process, so the second finds its programs
compiled; the order alternates (without, with, ...) and the table gives each run's
training seconds, the saves' own seconds (the time ``save`` held the loop: the device-to-
host copy) and the files' size.
"""
import argparse
import json
import pathlib
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--every", type=int, default=10, help="epochs between checkpoints")
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs (without, with)")
    parser.add_argument("--out", help="append the rows as JSON lines here")
    args = parser.parse_args()

    import jax

    import jaxflowers as jf
    from jaxflowers import recipes
    from jaxflowers.training import checkpoint

    data = recipes.load_data(args.data, image_size=recipes.IMAGE_SIZE["resnet50"])
    train_set, test_set = data.split_each_label(0.9, seed=0)
    devices = jax.devices()
    model = recipes.build_model("resnet50", len(data.class_names))
    saves = []
    real_save = checkpoint.Checkpointer.save

    def timed_save(self, *a, **k):  # how long each save holds the training loop
        start = time.perf_counter()
        path = real_save(self, *a, **k)
        saves.append(time.perf_counter() - start)
        return path

    checkpoint.Checkpointer.save = timed_save
    rows = []
    for with_checkpoints in (False, True) * args.rounds:
        folder = tempfile.mkdtemp(prefix="checkpoints-") if with_checkpoints else None
        opts = recipes.flowers_options(len(devices), len(train_set), validation_data=test_set,
                                       max_epochs=args.epochs, verbose=False,
                                       checkpoint_path=folder, checkpoint_frequency=args.every)
        del saves[:]
        start = time.perf_counter()
        _, info = jf.train(train_set, model, opts)
        wall = time.perf_counter() - start
        size = sum(p.stat().st_size for p in pathlib.Path(folder).rglob("*")
                   if p.is_file()) if folder else 0
        rows.append({"checkpoints": with_checkpoints, "epochs": args.epochs,
                     "every": args.every, "devices": len(devices),
                     "device": devices[0].device_kind, "train_s": round(info.train_time, 3),
                     "compile_s": round(info.compile_time, 2), "wall_s": round(wall, 2),
                     "saves": len(saves), "save_s": [round(s, 3) for s in saves],
                     "bytes": size, "iterations": int(len(info.loss))})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"{'checkpoints':>11} {'train s':>8} {'saves':>5} {'save s (each)':>24} {'MB':>7}")
    for r in rows:
        print(f"{str(r['checkpoints']):>11} {r['train_s']:8.2f} {r['saves']:5d} "
              f"{', '.join(f'{s:.3f}' for s in r['save_s']):>24} {r['bytes'] / 1e6:7.1f}")


if __name__ == "__main__":
    main()
