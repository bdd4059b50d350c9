"""Accuracy of the sweep's ``cifar_net(depth)`` on real CIFAR-10, candidate by candidate.

Trains the parfeval example's recipe (``recipes.sweep_options``: SGDM, 0.1 x 128/256,
L2 1e-10, mini-batch 128, 30 epochs, +-4 px translation and reflection, validation once per
epoch) on the CIFAR-10 training set of ``--npz`` (decoded once; 90 % train / 10 %
validation) through ``jaxflowers.train``, for every candidate x depth x seed, and prints
the final validation accuracy per candidate and depth (mean and spread over seeds) for
each way of using the batch-norm statistics:

- ``running``: the running averages (``info.final_validation_accuracy``);
- ``population``: recomputed after training with one pass over the training images
  (``jaxflowers.training.population``; MATLAB's ``BatchNormalizationStatistics="population"``);
- ``population-aug``: the same pass over augmented training images.

A candidate is a switch outside the library: precision, the dense layer's initialiser,
the split (a stratified random 10 % as the sweep's CLI takes, or MATLAB's
``splitEachLabel(imds, 0.9)``: the first 90 % of each label in file order).

Several trainings run at once, each in its own process on the one GPU (small networks
leave it mostly idle), sharing a persistent compilation cache. Results go to ``--out``
(JSON, rewritten after every training) and a table is printed last::

    python benchmarks/cifar_parity.py --npz cifar10-train.npz --candidates baseline float32 \\
        --depths 1 2 3 4 --seeds 0 1 2 --workers 3 --out parity.json
"""
from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import tempfile
import time

import numpy as np

# name -> (precision, dense-layer initialiser, split)
CANDIDATES = {
    "baseline": ("bfloat16", "lecun_normal", "random"),  # flax's dense init
    "float32": ("float32", "lecun_normal", "random"),
    "glorot": ("bfloat16", "glorot_uniform", "random"),  # the library's defaults
    "float32-glorot": ("float32", "glorot_uniform", "random"),
    "matlab-split": ("bfloat16", "glorot_uniform", "first"),
    "float32-glorot-matlab-split": ("float32", "glorot_uniform", "first"),
}
MODES = ("running", "population", "population-aug")
LONGEST_FIRST = (3, 4, 2, 1)  # cifar_net's step time by depth on an H200, longest first


def decode(npz: str, dest: str) -> tuple[str, str, list[str]]:
    """Decode the npz's JPEGs once (all cores) into uint8 .npy files; their paths, classes."""
    data = np.load(npz)
    blobs, offsets = data["bytes"], data["offsets"]
    chunks = [blobs[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]
    with mp.get_context("spawn").Pool() as pool:
        images = np.stack(pool.map(_decode_one, chunks, chunksize=500))
    paths = os.path.join(dest, "images.npy"), os.path.join(dest, "labels.npy")
    np.save(paths[0], images)
    np.save(paths[1], data["labels"].astype(np.int32))
    return paths[0], paths[1], [str(c) for c in data["classes"]]


def _decode_one(blob: bytes) -> np.ndarray:
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"), np.uint8)


def split(labels: np.ndarray, how: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices: "random" as the sweep (stratified, seeded), or "first"
    as MATLAB's ``splitEachLabel(imds, 0.9)`` (the first 90 % of each label, file order)."""
    from jaxflowers.data.imageset import split_each_label
    if how == "random":
        train, validation = split_each_label(labels, (0.9,), seed=seed,
                                             class_names=[str(c) for c in np.unique(labels)])
        return train, validation
    train, validation = [], []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        cut = int(np.floor(0.9 * len(members)))
        train.append(members[:cut])
        validation.append(members[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(validation))


def run_one(images, labels, classes, candidate: str, depth: int, seed: int, epochs: int) -> dict:
    """Train one network and score it on the validation split in every ``MODES`` way."""
    import jaxflowers as jf
    from jaxflowers import recipes
    from jaxflowers.training.population import population_statistics

    precision, dense_init, how = CANDIDATES[candidate]
    train_idx, val_idx = split(labels, how, seed)
    train_set = jf.data.ImageSet(images[train_idx], labels[train_idx], classes)
    val_set = jf.data.ImageSet(images[val_idx], labels[val_idx], classes)
    model = jf.models.cifar_net(depth, len(classes), dense_init=dense_init)
    steps = len(train_set) // 128
    opts = recipes.recipe("sweep").options(1, len(train_set), max_epochs=epochs, seed=seed,
                                           validation_data=val_set, verbose=False,
                                           verbose_frequency=steps)
    net, info = jf.train(train_set, model, opts,
                         execution=jf.ExecutionOptions(precision=precision))
    t0 = time.perf_counter()
    scores = {"running": info.final_validation_accuracy}
    for mode, augmentation in (("population", None), ("population-aug", opts.augmentation)):
        finished = population_statistics(net, train_set, augmentation=augmentation, seed=seed)
        predicted = np.argmax(jf.predict(finished, val_set), axis=1)
        scores[mode] = 100.0 * float(np.mean(predicted == val_set.labels))
    import jax
    return {"candidate": candidate, "depth": depth, "seed": seed, "accuracy": scores,
            "device": jax.devices()[0].device_kind,
            "validation_history": [float(a) for a in info.validation_accuracy],
            "compile_s": info.compile_time, "train_s": info.train_time,
            "population_s": time.perf_counter() - t0, "num_train": len(train_set),
            "num_validation": len(val_set)}


def worker(tasks, results, paths, classes, epochs: int, deadline: float) -> None:
    """A process on the GPU: runs tasks until none is left or the deadline has passed."""
    from jaxflowers.compilation.cache import enable_compilation_cache
    enable_compilation_cache()
    images, labels = np.load(paths[0], mmap_mode="r"), np.load(paths[1])
    images = np.ascontiguousarray(images)
    while time.time() < deadline:
        task = tasks.get()
        if task is None:
            break
        try:
            results.put(run_one(images, labels, classes, *task, epochs))
        except Exception as error:  # noqa: BLE001 (one failed training must not stop the rest)
            results.put({"candidate": task[0], "depth": task[1], "seed": task[2],
                         "error": f"{type(error).__name__}: {error}"})
    results.put(None)


def summarise(records: list[dict]) -> list[dict]:
    """Mean and spread (min-max) over seeds per candidate, depth and mode."""
    rows = []
    keys = sorted({(r["candidate"], r["depth"]) for r in records if "accuracy" in r},
                  key=lambda k: (list(CANDIDATES).index(k[0]), k[1]))
    for candidate, depth in keys:
        runs = [r for r in records if r.get("candidate") == candidate and r["depth"] == depth
                and "accuracy" in r]
        row = {"candidate": candidate, "depth": depth, "seeds": sorted(r["seed"] for r in runs),
               "train_s": float(np.mean([r["train_s"] for r in runs]))}
        for mode in MODES:
            values = np.array([r["accuracy"][mode] for r in runs])
            row[mode] = {"mean": float(values.mean()), "min": float(values.min()),
                         "max": float(values.max()), "std": float(values.std(ddof=1))
                         if len(values) > 1 else 0.0}
        last5 = [np.mean(r["validation_history"][-5:]) for r in runs]
        row["running_last5_mean"] = float(np.mean(last5))
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'candidate':<28} {'d':>1} {'n':>1} " + " ".join(f"{m:>19}" for m in MODES)
             + f" {'last5':>6} {'train s':>7}"]
    for row in rows:
        cells = " ".join(f"{row[m]['mean']:6.2f} [{row[m]['min']:5.2f},{row[m]['max']:5.2f}]"
                         for m in MODES)
        lines.append(f"{row['candidate']:<28} {row['depth']:>1} {len(row['seeds']):>1} {cells} "
                     f"{row['running_last5_mean']:6.2f} {row['train_s']:7.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--npz", required=True, help="cifar10-train.npz (JPEG bytes, labels)")
    parser.add_argument("--candidates", nargs="+", default=["baseline"], choices=CANDIDATES)
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--workers", type=int, default=3, help="trainings at once")
    parser.add_argument("--deadline", type=float, default=float("inf"),
                        help="start no training after this many seconds")
    parser.add_argument("--out", default="cifar_parity.json")
    args = parser.parse_args(argv)
    # Several processes share the GPU: each takes memory as it needs it.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    start = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        *paths, classes = decode(args.npz, scratch)
        print(f"decoded {args.npz} in {time.time() - start:.1f} s", flush=True)
        ctx = mp.get_context("spawn")
        tasks, results = ctx.Queue(), ctx.Queue()
        order = [(c, d, s) for s in args.seeds
                 for d in sorted(args.depths, key=LONGEST_FIRST.index) for c in args.candidates]
        for task in order + [None] * args.workers:
            tasks.put(task)
        procs = [ctx.Process(target=worker, args=(tasks, results, paths, classes, args.epochs,
                                                  start + args.deadline))
                 for _ in range(args.workers)]
        for proc in procs:
            proc.start()
        records, running = [], args.workers
        while running:
            record = results.get()
            if record is None:
                running -= 1
                continue
            records.append(record)
            print(json.dumps(record), flush=True)
            _write(args, records, time.time() - start)
        for proc in procs:
            proc.join()
    wall = time.time() - start
    _write(args, records, wall)
    print(f"\n{len(records)} of {len(order)} trainings in {wall:.1f} s "
          f"({args.workers} at a time); accuracy %, mean [min, max] over seeds")
    print(table(summarise(records)))
    return 0


def _write(args, records, wall: float) -> None:
    import jax  # only for the version: the parent never starts a backend
    payload = {"command": "python benchmarks/cifar_parity.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items()), "jax": jax.__version__, "wall_s": wall,
        "candidates": {c: CANDIDATES[c] for c in args.candidates},
        "summary": summarise(records), "runs": records}
    with open(args.out + ".tmp", "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    raise SystemExit(main())
