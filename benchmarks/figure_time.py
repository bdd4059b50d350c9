"""Seconds to draw and save the examples' confusion charts (the last thing a sweep or the
Flowers example does before it returns) and the sweep's live grid, per package tree, trees
alternating.

    python benchmarks/figure_time.py [--tree LABEL=FOLDER ...] [--rounds 5] [--repeats 5]

Each round runs every tree in a fresh process (``PYTHONPATH`` first), which draws each chart
``--repeats`` times after one untimed draw (fonts and caches warm, as at a run's end) and
prints the median seconds of building and of ``savefig`` (100 dpi). Charts: the sweep's (10
classes, 5,000 test images) and the Flowers example's (5 classes, 367); "grid": the sweep's
progress grid of 4 jobs x 9,360 iterations drawn and saved whole (``save``: as at a job's end);
"progress": the Flowers example's training-progress view of 2,080 iterations, drawn and saved.
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
import json, statistics, sys, time
import numpy as np
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from jaxflowers.plots import confusion_chart
repeats, out = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
charts = {"sweep": (("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                     "ship", "truck"), 5000, 0.77),
          "flowers": (("daisy", "dandelion", "roses", "sunflowers", "tulips"), 367, 0.82)}
row = {}
for name, (classes, count, right) in charts.items():
    true = rng.integers(0, len(classes), count)
    pred = np.where(rng.random(count) < right, true, rng.integers(0, len(classes), count))
    build, save = [], []
    for r in range(repeats + 1):
        start = time.perf_counter()
        chart = confusion_chart(true, pred, classes, row_summary="row-normalized",
                                column_summary="column-normalized",
                                title=f"test accuracy {100 * right:.2f}%")
        built = time.perf_counter()
        chart.savefig(f"{out}-{name}.png", dpi=100)
        saved = time.perf_counter()
        plt.close(chart.figure)
        if r:
            build.append(built - start)
            save.append(saved - built)
    row[name] = {"build_s": statistics.median(build), "save_s": statistics.median(save)}

# The sweep's live grid as a job's end redraws it: 4 jobs of 30 epochs of 312 iterations.
from jaxflowers.plots import SweepProgressPlot
grid = SweepProgressPlot(4, titles=[f"Depth {d}" for d in range(1, 5)])
for job in range(4):
    for i in range(1, 9361):
        grid.update(job, {"state": "iteration", "iteration": i, "epoch": (i - 1) // 312 + 1,
                          "accuracy": 60 + 20 * rng.random(), "loss": 0.5 + rng.random(),
                          **({"validation_accuracy": 70.0, "validation_loss": 0.9}
                             if i % 312 == 0 else {})})
times = []
for r in range(repeats + 1):
    grid.update(r % 4, {"state": "iteration", "iteration": 9361, "epoch": 30, "accuracy": 70.0,
                        "loss": 0.9})  # new data: the next save draws the figure again
    start = time.perf_counter()
    grid.save(f"{out}-grid.png", dpi=100)
    if r:
        times.append(time.perf_counter() - start)
row["grid"] = {"build_s": 0.0, "save_s": statistics.median(times)}

# The Flowers example's training-progress view as its last frame is drawn and saved: 80
# epochs of 26 iterations, validated every 103 (the file is written by its own thread, so
# ``save`` here times the same drawing in the caller).
from jaxflowers.plots import TrainingProgressPlot
n, per_epoch = 2080, 26
validated = np.arange(103, n + 1, 103)
info = {"iteration": np.arange(1, n + 1), "epoch": np.arange(n) // per_epoch + 1,
        "accuracy": 100 * rng.random(n), "loss": rng.random(n), "learn_rate": np.full(n, 0.02),
        "validation_iteration": validated, "validation_accuracy": 100 * rng.random(validated.size),
        "validation_loss": rng.random(validated.size), "num_devices": [1],
        "stop_reason": ["max epochs"]}
plot = TrainingProgressPlot(path=f"{out}-progress.png", max_epochs=80,
                            iterations_per_epoch=per_epoch, validation_frequency=103,
                            hardware="1 x NVIDIA H200 (shard_map)", stream=sys.stderr)
times = []
for r in range(repeats + 1):
    plot.update(dict(info))  # new data: the next save draws the figure again
    start = time.perf_counter()
    plot.save(f"{out}-progress.png", dpi=100)
    if r:
        times.append(time.perf_counter() - start)
plot.close()
row["progress"] = {"build_s": 0.0, "save_s": statistics.median(times)}
print(json.dumps(row))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    package_trees.add_argument(parser, optional=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="figure_time", help="prefix of the PNGs (and .json)")
    args = parser.parse_args()
    trees = package_trees.parse(parser, args.tree)
    rows = []
    for round_ in range(args.rounds):
        for name, tree in trees:
            env = package_trees.environment(tree, dict(os.environ, MPLBACKEND="Agg"))
            result = subprocess.run([sys.executable, "-c", CHILD, str(args.repeats),
                                     f"{args.out}-{name}"], env=env, capture_output=True,
                                    text=True)
            if result.returncode:
                sys.exit(f"tree {name} failed:\n{result.stderr[-2000:]}")
            rows.append({"round": round_, "tree": name, **json.loads(result.stdout)})
            print(json.dumps(rows[-1]), flush=True)
    print(f"{'tree':10s} {'chart':8s} {'build s (median of rounds)':>28s} {'save s':>8s}")
    for name, _ in trees:
        for chart in ("sweep", "flowers", "grid", "progress"):
            mine = [r[chart] for r in rows if r["tree"] == name]
            print(f"{name:10s} {chart:8s} {statistics.median(m['build_s'] for m in mine):28.3f} "
                  f"{statistics.median(m['save_s'] for m in mine):8.3f}")
    with open(f"{args.out}.json", "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
