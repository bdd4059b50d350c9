"""Seconds per checkpoint write, per package tree, trees alternating: a training with a
checkpoint every iteration, on synthetic images.

    python benchmarks/checkpoint_writes.py [--tree LABEL=FOLDER ...] [--model cifar_net:2]
        [--iterations 12] [--batch 32] [--rounds 2] [--out FILE.json]

Each round runs every tree in a fresh process (``PYTHONPATH`` first). The process trains
``--model`` twice for ``--iterations`` iterations: once without checkpoints, once with one
every iteration (the programs are compiled by then). It prints the median seconds of the
checkpointer's own write (``Checkpointer._write``, in its thread; the first write is left
out), and the training seconds per iteration without and with checkpoints.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under safe-path
import package_trees

CHILD = r"""
import json, sys, tempfile, time
import numpy as np
import jaxflowers as jf
from jaxflowers import recipes
from jaxflowers.training import checkpoint

model_spec, iterations, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
name, _, depth = model_spec.partition(":")  # "cifar_net:<depth>" or a network's name
size = recipes.IMAGE_SIZE[name]
rng = np.random.default_rng(0)
n = iterations * batch
images = rng.integers(0, 256, (n, *size, 3), dtype=np.uint8)
data = jf.data.ImageSet(images, np.arange(n) % 10, tuple("abcdefghij"))
model = recipes.build_model((name, {"depth": int(depth)}) if depth else name, 10)
writes = []
real_write = checkpoint.Checkpointer._write

def timed_write(self, *a, **k):
    start = time.perf_counter()
    real_write(self, *a, **k)
    writes.append(time.perf_counter() - start)

checkpoint.Checkpointer._write = timed_write
row = {}
for label, folder in (("without", None), ("with", tempfile.mkdtemp(prefix="ck-"))):
    opts = jf.TrainingOptions(solver="adam", mini_batch_size=batch, max_epochs=1,
                              shuffle="never", verbose=False, checkpoint_path=folder,
                              checkpoint_frequency=1, checkpoint_frequency_unit="iteration")
    _, info = jf.train(data, model, opts)
    row[f"train_s_per_iteration_{label}"] = info.train_time / len(info.loss)
row["writes"] = len(writes)
row["write_s"] = float(np.median(writes[1:])) if len(writes) > 1 else None
print(json.dumps(row))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    package_trees.add_argument(parser, optional=True)
    parser.add_argument("--model", default="cifar_net:2", help="cifar_net:<depth> or a name")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", help="JSON file for the rows")
    args = parser.parse_args()
    trees = package_trees.parse(parser, args.tree)
    rows = []
    for round_ in range(args.rounds):
        for name, tree in package_trees.in_round(trees, round_):
            result = subprocess.run([sys.executable, "-c", CHILD, args.model,
                                     str(args.iterations), str(args.batch)],
                                    env=package_trees.environment(tree), capture_output=True,
                                    text=True)
            if result.returncode:
                sys.exit(f"tree {name} failed:\n{result.stderr[-2000:]}")
            rows.append({"round": round_, "tree": name, "model": args.model,
                         **json.loads(result.stdout.strip().splitlines()[-1])})
            print(json.dumps(rows[-1]), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(rows, f, indent=1)
    print(f"{'tree':10s} {'write s':>8s} {'s/iteration without':>20s} {'with':>8s}  (medians)")
    for name, _ in trees:
        mine = [r for r in rows if r["tree"] == name]
        print(f"{name:10s} {statistics.median(r['write_s'] for r in mine):8.3f} "
              f"{statistics.median(r['train_s_per_iteration_without'] for r in mine):20.3f} "
              f"{statistics.median(r['train_s_per_iteration_with'] for r in mine):8.3f}")


if __name__ == "__main__":
    main()
