"""What pruning buys a random search: python benchmarks/experiment_search.py --data DATA

Runs one 16-trial random search over cifar_net's depth, the learning rate and the L2 factor
on the "sweep" recipe (the parfeval example's SGDM options), twice on the same 16 points
(the points depend only on the seed): once with the median pruner, once without
(``--pruners`` picks). Each run gets a fresh compilation cache, so neither inherits the
other's compiled programs. Prints (and writes to OUT/experiment_search.json) the wall time
of each run, its trials (with each one's compile and training seconds), the programs its
cache stored and the best validation accuracy it found, with the GPU, JAX version and batch
per device; the experiments' progress goes to stderr.

DATA is the CIFAR-10 training split as a folder of class folders, or as
``cifar10-train.npz`` (arrays ``bytes``, ``offsets``, ``labels``, ``classes``: image i is
the JPEG ``bytes[offsets[i]:offsets[i+1]]``), unpacked once into OUT. The split is 80 %
training, 10 % validation, 10 % test, per class. On one H200:

    python benchmarks/experiment_search.py --data /path/cifar10-train.npz --jobs-per-device 4
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import jaxflowers as jf

BATCH = 128  # the sweep recipe's mini-batch (one device per trial)


def unpack(npz: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """``DEST/<class>/<index>.jpg`` from a CIFAR-10 npz (its JPEG bytes unchanged), once."""
    with np.load(npz) as arrays:
        classes = [str(c) for c in arrays["classes"]]
        data, offsets, labels = arrays["bytes"], arrays["offsets"], arrays["labels"]
        if dest.is_dir() and sum(1 for _ in dest.rglob("*.jpg")) == len(labels):
            return dest
        shutil.rmtree(dest, ignore_errors=True)
        for name in classes:
            (dest / name).mkdir(parents=True)
        for i, label in enumerate(labels):
            (dest / classes[label] / f"{i:05d}.jpg").write_bytes(
                data[offsets[i]:offsets[i + 1]].tobytes())
    return dest


def search(args, data: str, pruned: bool, out: pathlib.Path) -> dict:
    """One run of the search (a fresh study and compilation cache); its numbers."""
    import optuna

    images = sum(1 for _ in pathlib.Path(data).rglob("*.jpg"))
    per_epoch = max(1, int(0.8 * images) // BATCH)  # validated once an epoch (the recipe)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=3 * per_epoch) \
        if pruned else "none"
    name = "pruned" if pruned else "unpruned"
    experiment = jf.sweep.Experiment(
        recipe="sweep", data=data, strategy="random", trials=args.trials, seed=args.seed,
        params={"depth": [1, 2, 3, 4], "initial_learn_rate": jf.sweep.loguniform(1e-3, 3e-1),
                "l2_regularization": jf.sweep.loguniform(1e-10, 1e-2)},
        options={"max_epochs": args.epochs}, pruner=pruner, name=name, out_dir=out / name)
    cache = os.environ["JAXFLOWERS_COMPILE_CACHE"] = tempfile.mkdtemp(prefix=f"xla-{name}-",
                                                                       dir=out)
    result = experiment.run(devices=args.devices, jobs_per_device=args.jobs_per_device,
                            live=False, stream=sys.stderr)  # stdout: the JSON alone
    table = result.table
    complete = table[table["state"] == "complete"]
    timed = [c for c in ("compile_time", "train_time") if c in table]  # not in older tables
    return {"pruner": "median" if pruned else "none", "wall_time_s": result.wall_time,
            # the programs compiled: a trial that compiles nothing new adds no entry
            "cache_entries": sum(1 for _ in pathlib.Path(cache).iterdir()),
            "compile_time_s": float(complete["compile_time"].sum()) if timed else None,
            "best_validation_accuracy": float(complete["objective"].max()) if len(complete)
            else None,
            "test_accuracy": result.test_accuracy,
            "states": table["state"].value_counts().to_dict(),
            "trials": json.loads(table[["trial", "state", "depth", "initial_learn_rate",
                                        "l2_regularization", "objective", "pruned_at_iteration",
                                        "iterations", "wall_time", *timed, "where"]].to_json(
                orient="records"))}


def device_kind() -> str:
    """The first GPU's name from nvidia-smi (no JAX in this process), or "cpu"."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True)
        return out.stdout.splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return "cpu"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True,
                        help="CIFAR-10's training split: a folder of class folders or an npz")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=30, help="the sweep recipe's 30")
    parser.add_argument("--devices", default="all")
    parser.add_argument("--jobs-per-device", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pruners", nargs="+", choices=("median", "none"),
                        default=["median", "none"])
    parser.add_argument("--out", default="runs/experiment_search")
    args = parser.parse_args(argv)
    args.devices = int(args.devices) if args.devices.isdigit() else args.devices
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = args.data
    if data.endswith(".npz"):
        data = str(unpack(pathlib.Path(data), out / "cifar10-train"))
    if not os.path.isdir(data):
        parser.error(f"--data {args.data}: neither a folder of class folders nor an .npz")
    runs = [search(args, data, pruner == "median", out) for pruner in args.pruners]
    record = {"benchmark": "experiment_search", "device_kind": device_kind(),
              "jax": importlib.metadata.version("jax"),
              "optuna": importlib.metadata.version("optuna"), "data": data,
              "trials": args.trials, "epochs": args.epochs, "batch_per_device": BATCH,
              "jobs_per_device": args.jobs_per_device, "devices": args.devices,
              "seed": args.seed, "runs": runs}
    if args.pruners == ["median", "none"]:
        record["speedup_from_pruning"] = runs[1]["wall_time_s"] / runs[0]["wall_time_s"]
    text = json.dumps(record, indent=1)
    (out / "experiment_search.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
