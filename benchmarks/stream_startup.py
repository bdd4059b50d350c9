"""Steady speed and start-up of streamed training against resident, ResNet-50.

    python benchmarks/stream_startup.py [--images 20600] [--size 224] [--memmap DIR] \
        [--tree LABEL=FOLDER ...] [--epochs 2] [--rounds 3] [--measure steady cold] [--out FILE]

Placements: "resident" (the set copied to the device), "stream" (batches from host memory
through grain) and, with ``--memmap DIR``, "stream-memmap" (the same images written to
``DIR/images.npy`` and streamed from the memory map). Random pixels, 102 classes, the
Flowers example's Adam, batch 128 and augmentation, no validation.

"steady": one process per package tree trains every placement in turn, ``--rounds`` times,
``--epochs`` each (the first call, which compiles, is not counted), so that the placements
are compared on the same GPU within seconds of each other; each row is ``info.images_per_s``
and its share of the resident run of its round. "cold": a fresh process per placement with
the compilation cache off: ``info.setup_time`` / ``compile_time`` / ``placing_time``. With
``--tree`` (repeatable), each package tree is first on ``PYTHONPATH`` in turn.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under safe-path
import package_trees

CHILD = r"""
import json, sys, time
import numpy as np
import jaxflowers as jf
from jaxflowers.compilation.cache import enable_compilation_cache
enable_compilation_cache()  # $JAXFLOWERS_COMPILE_CACHE: a folder, or off
count, size, memmap, epochs, rounds = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                       int(sys.argv[4]), int(sys.argv[5]))
placements = sys.argv[6:]
rng = np.random.default_rng(0)
labels = rng.integers(0, 102, count)
names = tuple(str(i) for i in range(102))
sets = {"resident": None, "stream": None, "stream-memmap": None}
if memmap != "-":
    sets["stream-memmap"] = jf.data.ImageSet(np.load(memmap, mmap_mode="r"), labels, names)
if any(p in ("resident", "stream") for p in placements):
    images = rng.integers(0, 256, (count, size, size, 3), dtype=np.uint8)
    sets["resident"] = sets["stream"] = jf.data.ImageSet(images, labels, names)
model = jf.models.resnet50(num_classes=102)
options = jf.recipes.flowers_options(1, count, max_epochs=epochs).replace(
    verbose=False, validation_frequency=10**9)
for r in range(-1, rounds):  # round -1 compiles
    for placement in placements:
        start = time.perf_counter()
        net, info = jf.train(sets[placement], model, options,
                             execution=jf.ExecutionOptions(data_placement=placement.split("-")[0]))
        print(json.dumps({"round": r, "placement": placement, "iterations": len(info.loss),
                          "wall_s": time.perf_counter() - start, "setup_s": info.setup_time,
                          "compile_s": info.compile_time, "placing_s": info.placing_time,
                          "train_s": info.train_time, "images_per_s": info.images_per_second,
                          "data": info.data_placement}), flush=True)
"""


def child(tree, placements, args, memmap, rounds, cache) -> list[dict]:
    """The child's JSON lines (an ``error`` row if it failed)."""
    env = package_trees.environment(tree, dict(os.environ, JAXFLOWERS_COMPILE_CACHE=cache))
    result = subprocess.run([sys.executable, "-c", CHILD, str(args.images), str(args.size),
                             memmap, str(args.epochs), str(rounds), *placements], env=env,
                            capture_output=True, text=True)
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode:
        rows.append({"error": result.stderr[-1500:]})
    return rows


def write_memmap(folder: str, count: int, size: int) -> str:
    """The child's random images (same draws) as ``folder/images.npy``."""
    import numpy as np

    path = os.path.join(folder, "images.npy")
    rng = np.random.default_rng(0)
    rng.integers(0, 102, count)  # the labels' draw, as in the child
    out = np.lib.format.open_memmap(path, "w+", np.uint8, (count, size, size, 3))
    out[:] = rng.integers(0, 256, out.shape, dtype=np.uint8)
    out.flush()
    return path


def summarise(rows: list[dict]) -> list[dict]:
    """Per tree and placement: median images/s and median share of its round's resident run."""
    table = []
    for tree in dict.fromkeys(r["tree"] for r in rows):
        runs = [r for r in rows if r["tree"] == tree and "images_per_s" in r and r["round"] >= 0]
        resident = {r["round"]: r["images_per_s"] for r in runs if r["placement"] == "resident"}
        for placement in dict.fromkeys(r["placement"] for r in runs):
            mine = [r for r in runs if r["placement"] == placement]
            shares = [r["images_per_s"] / resident[r["round"]] for r in mine
                      if r["round"] in resident]
            table.append({"tree": tree, "placement": placement,
                          "images_per_s": [round(r["images_per_s"]) for r in mine],
                          "median": statistics.median(r["images_per_s"] for r in mine),
                          "share_median": statistics.median(shares) if shares else None})
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20600, help="3.1 GB at 224x224")
    parser.add_argument("--size", type=int, default=224, help="pixels per side")
    parser.add_argument("--memmap", help="folder for the memory-mapped copy of the set")
    package_trees.add_argument(parser, optional=True)
    parser.add_argument("--epochs", type=int, default=2, help="per training")
    parser.add_argument("--rounds", type=int, default=3, help="timed trainings per placement")
    parser.add_argument("--measure", nargs="+", choices=("steady", "cold"), default=["steady"])
    parser.add_argument("--out", help="JSON file for the rows")
    args = parser.parse_args()
    placements = ["resident", "stream"]
    memmap = "-"
    trees = package_trees.parse(parser, args.tree)  # refused before the set is written
    if args.memmap:
        memmap = write_memmap(args.memmap, args.images, args.size)
        placements.append("stream-memmap")
    cache = os.path.join(args.memmap or tempfile.gettempdir(), "stream-bench-xla")
    rows = []
    for name, tree in trees:
        if "cold" in args.measure:
            for placement in placements:
                for row in child(tree, [placement], args, memmap, 0, "off"):
                    rows.append({"tree": name, "measure": "cold", **row})
                    print(json.dumps(rows[-1]), flush=True)
        if "steady" in args.measure:
            for row in child(tree, placements, args, memmap, args.rounds, cache):
                rows.append({"tree": name, "measure": "steady", **row})
                print(json.dumps(rows[-1]), flush=True)
    for row in rows:
        if row["measure"] == "cold" and "setup_s" in row:
            print(f"cold {row['tree']:8s} {row['placement']:14s} set-up {row['setup_s']:5.1f} s "
                  f"(compile {row['compile_s']:5.1f}, placing {row['placing_s']:4.1f})")
    table = summarise([r for r in rows if r["measure"] == "steady"])
    print(f"{'tree':8s} {'placement':14s} {'median img/s':>12s} {'of resident':>11s}  runs")
    for t in table:
        share = f"{100 * t['share_median']:10.1f}%" if t["share_median"] else f"{'-':>11s}"
        print(f"{t['tree']:8s} {t['placement']:14s} {t['median']:12,.0f} {share}  "
              f"{t['images_per_s']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "table": table}, f, indent=1)


if __name__ == "__main__":
    main()
