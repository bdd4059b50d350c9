"""Start-up and steady speed of streamed training against resident, ResNet-50.

    python benchmarks/stream_startup.py [--images 20600] [--epochs 2] [--size 224] [--memmap DIR]

Each placement trains in a fresh process with the compilation cache off (a cold start):
"resident" (the set copied to the device), "stream" (batches from host memory through
grain) and, with ``--memmap DIR``, "stream-memmap" (the set written to ``DIR/images.npy``
and streamed from the memory map). Random pixels, 102 classes, the Flowers example's
Adam, batch 128 and augmentation, no validation. Prints one JSON line per run, then a table
of ``info.setup_time`` / ``compile_time`` / ``placing_time``, the training time and the
steady images/s.
"""
import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
import jaxflowers as jf
placement, count, epochs, memmap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
size = int(sys.argv[5])
rng = np.random.default_rng(0)
labels = rng.integers(0, 102, count)
if memmap != "-":
    images = np.load(memmap, mmap_mode="r")
else:
    images = rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8)
data = jf.data.ImageSet(images, labels, tuple(str(i) for i in range(102)))
options = jf.recipes.flowers_options(1, count, max_epochs=epochs).replace(
    verbose=False, validation_frequency=10**9)
start = time.perf_counter()
net, info = jf.train(data, jf.models.resnet50(num_classes=102), options,
                     execution=jf.ExecutionOptions(data_placement=placement.split("-")[0]))
print(json.dumps({"placement": placement, "wall_s": time.perf_counter() - start,
                  "setup_s": info.setup_time, "compile_s": info.compile_time,
                  "placing_s": info.placing_time, "train_s": info.train_time,
                  "images_per_s": info.images_per_second, "data": info.data_placement}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20600, help="3.1 GB at 224x224")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--size", type=int, default=224, help="pixels per side")
    parser.add_argument("--memmap", help="folder for the memory-mapped copy of the set")
    parser.add_argument("--out", help="JSON file for the rows")
    args = parser.parse_args()
    runs = [("resident", "-"), ("stream", "-")]
    if args.memmap:
        import numpy as np

        path = os.path.join(args.memmap, "images.npy")
        rng = np.random.default_rng(0)
        rng.integers(0, 102, args.images)  # the labels' draw, as in the child
        shape = (args.images, args.size, args.size, 3)
        out = np.lib.format.open_memmap(path, "w+", np.uint8, shape)
        for begin in range(0, args.images, 1024):
            stop = min(begin + 1024, args.images)
            out[begin:stop] = rng.integers(0, 256, (stop - begin, args.size, args.size, 3),
                                            dtype=np.uint8)
        out.flush()
        del out
        runs.append(("stream-memmap", path))
    env = dict(os.environ, JAXFLOWERS_COMPILE_CACHE="off")
    rows = []
    for placement, memmap in runs:
        result = subprocess.run([sys.executable, "-c", CHILD, placement, str(args.images),
                                 str(args.epochs), memmap, str(args.size)], env=env,
                                capture_output=True, text=True)
        if result.returncode:
            row = {"placement": placement, "error": result.stderr[-1500:]}
        else:
            row = json.loads(result.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"{'placement':14s} {'setup':>6s} {'compile':>8s} {'placing':>8s} {'train':>6s} "
          f"{'images/s':>9s}")
    for r in rows:
        if "error" in r:
            print(f"{r['placement']:14s} FAILED")
            continue
        print(f"{r['placement']:14s} {r['setup_s']:6.1f} {r['compile_s']:8.1f} "
              f"{r['placing_s']:8.1f} {r['train_s']:6.1f} {r['images_per_s']:9,.0f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
