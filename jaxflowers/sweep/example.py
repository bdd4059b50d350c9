"""MATLAB's "Use parfeval to Train Multiple Deep Learning Networks", end to end.

``run_sweep`` trains ``cifar_net(depth)`` for several depths side by side on a
``DevicePool`` (``parfeval``), prints a live table and feeds the sweep grid from the
pool's progress messages (``afterEach``), fetches the networks (``fetchOutputs``), picks
the one with the best final validation accuracy, evaluates it on the test set and saves
its confusion chart and the progress grid as PNGs.

The data travel to the jobs by reference (a small JSON "plan": a data spec plus split
parameters and a seed); every worker loads and splits the data itself, deterministically,
and the caller rebuilds the same test set after the jobs end. Folder data are decoded
into their resize caches by the caller before any job starts (:func:`prepare_data`), so
the workers only open finished caches. Nothing here imports JAX before the jobs are
submitted: a caller that initialised a GPU backend first would hold memory on the GPUs
its workers need.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pathlib
import sys
import time
from typing import Any, Mapping, Sequence, TextIO

from jaxflowers import recipes
from jaxflowers.sweep.jobs import load_data, train_job
from jaxflowers.sweep.pool import DevicePool

IMAGE_SIZE = recipes.IMAGE_SIZE["cifar_net"]  # as in the MATLAB example
HOLD_OUT = (0.8, 0.1)  # digits or a plain folder: train / validation / rest for test
CIFAR_VALIDATION = 0.1  # CIFAR-10: 5,000 of the 50,000 training images validate
_ROW = "{:>4} {:>6} {:>6} {:>10} {:>11} {:>11}"


class DataUnavailableError(RuntimeError):
    """The sweep's data set cannot be loaded here (e.g. CIFAR-10 not prepared for TFDS)."""


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """What ``run_sweep`` found; per-job tuples are aligned with ``depths``."""

    depths: tuple[int, ...]  # the cifar_net depth of each job
    validation_accuracies: tuple[float | None, ...]  # final validation accuracy, %; None: failed
    errors: tuple[str | None, ...]  # why a job failed ("cancelled", first error line) or None
    best_depth: int | None  # depth of the best network; None when every job failed
    test_accuracy: float | None  # the best network's test-set accuracy, %
    wall_time: float  # seconds, data checks to saved plots
    confusion_path: pathlib.Path | None  # the best network's confusion chart (PNG)
    progress_path: pathlib.Path  # the 2 x 2 (or larger) progress grid (PNG)
    log_dir: pathlib.Path  # one log per job: its MATLAB-style table and any traceback
    best_net: Any = dataclasses.field(default=None, repr=False)  # the best TrainedNet


# ---------------------------------------------------------------- the data plan

def data_plan(data: str, *, seed: int = 0) -> dict:
    """How the example gets its three sets from ``data``, as JSON-able data for the jobs.

    Args:
      data: "cifar10" (TFDS, prepared beforehand: its test split, 5,000 training images
        held out for validation), "digits" (embedded, offline) or a local folder. A folder
        holding ``train/`` and ``test/`` class folders is split like CIFAR-10; any other
        folder of class folders, like "digits", by ``split_each_label(0.8, 0.1)``
        (train / validation / test). Folder images are resized to 32 x 32.
      seed: the seed of the stratified random splits.

    Returns:
      ``{"train": spec, "validation": fraction, "test": spec, "seed": seed}`` or
      ``{"source": spec, "fractions": [0.8, 0.1], "seed": seed}``, where each spec is one
      that ``jaxflowers.sweep.jobs.load_data`` understands.

    Raises:
      DataUnavailableError: CIFAR-10 is not prepared, or ``data`` names nothing known.
    """
    if data == "cifar10":
        _require_tfds("cifar10")
        return {"train": "cifar10", "validation": CIFAR_VALIDATION, "test": "cifar10:test",
                "seed": seed}
    if data == "digits":
        return {"source": "digits", "fractions": list(HOLD_OUT), "seed": seed}
    if not os.path.isdir(data):
        raise DataUnavailableError(f"data {data!r} is neither 'cifar10', 'digits' nor an "
                                   "existing folder of class folders")
    root = os.path.abspath(data)
    parts = {p: {"folder": os.path.join(root, p), "image_size": list(IMAGE_SIZE)}
             for p in ("train", "test")}
    if all(os.path.isdir(p["folder"]) for p in parts.values()):
        return {**parts, "validation": CIFAR_VALIDATION, "seed": seed}
    return {"source": {"folder": root, "image_size": list(IMAGE_SIZE)},
            "fractions": list(HOLD_OUT), "seed": seed}


def _require_tfds(name: str) -> None:
    """Raise ``DataUnavailableError`` unless TFDS has ``name`` prepared (imports no JAX).

    Preparing needs TensorFlow and a network; several workers doing it at once would race,
    so the sweep asks for a prepared set instead.
    """
    hint = (" Run the sweep offline with --data digits (embedded) or --data FOLDER (class "
            "folders, or train/ and test/ holding class folders).")
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataUnavailableError(f"--data {name} needs tensorflow-datasets "
                                   f'(pip install "jaxflowers[tfds]").{hint}') from None
    try:
        builder = tfds.builder(name)
        prepared = builder.is_prepared()
    except Exception as error:  # noqa: BLE001 (a broken data_dir is "not available" too)
        raise DataUnavailableError(f"TFDS cannot open {name!r}: {error}.{hint}") from error
    if not prepared:
        raise DataUnavailableError(
            f"TFDS data set {name!r} is not prepared in {builder.data_dir}. Prepare it once "
            f"where TensorFlow and a network are available (tfds build {name} "
            "--file_format=array_record) and set TFDS_DATA_DIR to that folder." + hint)


def load_sets(plan: Mapping) -> tuple[Any, Any, Any]:
    """(train, validation, test) image sets of a :func:`data_plan`; may import JAX."""
    seed = plan.get("seed", 0)
    if "source" in plan:
        whole, _ = load_data(plan["source"])
        return whole.split_each_label(*plan["fractions"], seed=seed)
    train, validation = load_data({"train": plan["train"], "validation": plan["validation"],
                                   "seed": seed})
    test, _ = load_data(plan["test"])
    return train, validation, test


def prepare_data(plan: Mapping) -> list:
    """Build (or open) the resize cache of every folder in ``plan``, here; imports no JAX.

    ``run_sweep`` calls it before submitting any job. Otherwise the first worker would
    decode every image while the others wait on the cache's lock; here the caller
    decodes (in processes, for a large folder) and the workers only open the caches.

    Args:
      plan: a :func:`data_plan`.

    Returns:
      The ``ImageFolder`` of each folder spec in ``plan``, caches ready (none for
      "digits" or CIFAR-10).

    Raises:
      DataUnavailableError: a folder cannot be read or holds an undecodable image.
    """
    folders = []
    for part in ("source", "train", "test"):
        spec = plan.get(part)
        if isinstance(spec, Mapping) and "folder" in spec:
            try:
                folder, _ = load_data(spec)  # the ImageFolder the workers will construct
                folder.cache_path  # builds the cache, or opens a valid one
            except (OSError, ValueError) as error:
                raise DataUnavailableError(f"cannot prepare {spec['folder']}: {error}"
                                           ) from error
            folders.append(folder)
    return folders


def _prepare(plan: Mapping, stream: TextIO) -> None:
    """:func:`prepare_data`, and one line saying how long it took."""
    start = time.perf_counter()
    folders = prepare_data(plan)
    what = (f"{sum(map(len, folders)):,} images in {len(folders)} resize cache(s)" if folders
            else "nothing to decode")
    print(f"Prepared the data in {time.perf_counter() - start:.1f} s ({what})", file=stream,
          flush=True)


# ---------------------------------------------------------------- the job

def depth_job(*, data: Mapping, depth: int, max_epochs: int = 30, seed: int = 0,
              options_overrides: Mapping | None = None):
    """One job of the sweep: ``cifar_net(depth)`` with the example's options (in a worker).

    MATLAB: the ``trainNetwork`` call each ``parfeval`` of the example runs.

    Args:
      data: a :func:`data_plan`; the worker loads and splits the data itself.
      depth: convolutions per block of ``cifar_net``.
      max_epochs: training epochs (the example: 30).
      seed: initialisation, shuffling and augmentation.
      options_overrides: ``TrainingOptions`` fields replacing the "sweep" recipe's,
        as ``train_job`` takes them (``augmentation`` may be a dict); a new
        ``mini_batch_size`` keeps validation at once per epoch.

    Returns:
      ``(net, info, test_codes)``: ``net`` and ``info`` from ``train_job``, whose progress
      messages reach ``after_each``, and the predicted class index (int32) of every test
      image. The job predicts its test set itself, on the GPU it already holds, so the
      caller never starts JAX on the GPUs to test the best network.
    """
    import numpy as np

    from jaxflowers.predict import predict

    train_set, validation_set, test_set = load_sets(data)
    overrides = dict(options_overrides or {})
    if "mini_batch_size" in overrides:  # keep validating once per epoch
        overrides.setdefault("validation_frequency",
                             max(1, len(train_set) // int(overrides["mini_batch_size"])))
    options = recipes.recipe("sweep").options(1, len(train_set), max_epochs=max_epochs)
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    net, info = train_job(data={"train": train_set, "validation": validation_set},
                          model=("cifar_net", {"depth": depth}),
                          options={**fields, **overrides}, seed=seed)
    test_codes = np.argmax(predict(net, test_set), axis=1).astype(np.int32)
    print(f"Predicted the {len(test_set)} test images", flush=True)
    return net, info, test_codes


# ---------------------------------------------------------------- progress in the caller

class ProgressTable:
    """An ``after_each`` callback printing one row per job and validation (once an epoch).

    Columns: job, depth, epoch, iteration, mini-batch accuracy and validation accuracy (%);
    a job's first step and its end get a line with the sweep's clock, so start-up,
    compile and training can be told apart; a failed or cancelled job gets one line saying
    so. ``began``/``ended`` hold those times (seconds since ``start``) by job index.
    """

    def __init__(self, depths: Sequence[int], stream: TextIO, start: float | None = None):
        self.depths, self.stream = tuple(depths), stream
        self.start = time.perf_counter() if start is None else start
        self.began: dict[int, float] = {}
        self.ended: dict[int, float] = {}

    def header(self) -> None:
        """Print the column names."""
        self._print(_ROW.format("Job", "Depth", "Epoch", "Iteration", "Mini-batch", "Validation"))

    def __call__(self, job_index: int, message: Mapping) -> None:
        state, depth = message.get("state"), self.depths[job_index]
        if state == "validation":
            self._print(_ROW.format(job_index, depth, message["epoch"], message["iteration"],
                                    _percent(message.get("accuracy")),
                                    _percent(message.get("validation_accuracy"))))
        elif state in ("start", "done"):
            now = time.perf_counter() - self.start
            (self.began if state == "start" else self.ended)[job_index] = now
            what = "first step" if state == "start" else "training done"
            self._print(f"{job_index:>4} {depth:>6} {what} at {now:.1f} s")
        elif state in ("failed", "cancelled"):
            why = f": {message['error']}" if message.get("error") else ""
            self._print(f"{job_index:>4} {depth:>6} {state}{why}")

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def _percent(value) -> str:
    return "" if value is None else f"{value:.2f}%"


# ---------------------------------------------------------------- the sweep

def run_sweep(depths: Sequence[int] = (1, 2, 3, 4), *, data: str = "cifar10", epochs: int = 30,
              devices="all", jobs_per_device: int = 1, out_dir: str | os.PathLike = ".",
              seed: int = 0, stream: TextIO | None = None,
              options_overrides: Mapping | None = None) -> SweepResult:
    """Train ``cifar_net`` of each depth side by side, pick the best, test it, plot it.

    MATLAB: "Use parfeval to Train Multiple Deep Learning Networks" (``parfeval`` per
    depth, ``afterEach`` plots, ``fetchOutputs``, best by ``FinalValidationAccuracy``,
    ``classify`` on the test set, ``confusionchart`` with row and column summaries).

    Args:
      depths: one job per depth (ints >= 1).
      data: "cifar10", "digits" or a folder (see :func:`data_plan`).
      epochs: training epochs per job.
      devices, jobs_per_device: the ``DevicePool``'s slots (GPUs, or CPU slots).
      out_dir: where ``confusion_best.png``, ``sweep_progress.png`` and ``sweep-logs/`` go.
      seed: data splits, initialisation, shuffling and augmentation.
      stream: where the table and results are printed (default ``sys.stdout``).
      options_overrides: ``TrainingOptions`` fields to change in every job, e.g.
        ``{"steps_per_dispatch": 1}``.

    Returns:
      A :class:`SweepResult`. Failed or cancelled jobs are reported and skipped.

    Raises:
      DataUnavailableError: before any job starts, when ``data`` cannot be loaded (a
        folder with an undecodable image, too).
      ValueError: no depth, a depth or ``epochs`` below 1.
    """
    start, stream = time.perf_counter(), stream or sys.stdout
    depths = tuple(int(d) for d in depths)
    if not depths or min(depths) < 1 or int(epochs) < 1:
        raise ValueError(f"run_sweep(depths={depths}, epochs={epochs}): need at least one "
                         "depth, every depth and epochs >= 1")
    plan = data_plan(data, seed=seed)
    _prepare(plan, stream)  # before any job: the workers then only open finished caches
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with DevicePool(devices, jobs_per_device, log_dir=out / "sweep-logs") as pool:
        plot, table = _watch(pool, depths, stream, start)
        futures = [pool.submit(depth_job, data=plan, depth=d, max_epochs=epochs, seed=seed,
                               options_overrides=dict(options_overrides or {}))
                   for d in depths]
        outputs, errors = _fetch(futures)
    progress_path = out / "sweep_progress.png"
    plot.save(progress_path, dpi=100)
    plot.close()
    infos = [None if o is None else o[1] for o in outputs]
    accuracies = tuple(None if i is None else i.final_validation_accuracy for i in infos)
    best = _report(depths, infos, errors, table, stream)
    test_accuracy = confusion_path = best_net = None
    if best is not None:
        best_net, _, test_codes = outputs[best]
        test_accuracy, confusion_path = _evaluate(best_net, test_codes, plan, depths[best], out,
                                                  stream)
    return SweepResult(depths, accuracies, errors, None if best is None else depths[best],
                       test_accuracy, time.perf_counter() - start, confusion_path,
                       progress_path, pool.log_dir, best_net)


def _watch(pool: DevicePool, depths: tuple[int, ...], stream: TextIO,
           start: float | None = None):
    """Register the live table and the progress grid before any job can report; both."""
    from jaxflowers.live import sweep_progress  # matplotlib, no JAX

    plot = sweep_progress(pool, num_jobs=len(depths), titles=[f"Depth {d}" for d in depths])
    print(f"Training {len(depths)} networks (cifar_net depths {', '.join(map(str, depths))}) "
          f"on {pool.num_slots} slot(s) of a {pool.backend} pool; job logs in {pool.log_dir}",
          file=stream)
    table = ProgressTable(depths, stream, start)
    table.header()
    pool.after_each(table)
    return plot, table


def _fetch(futures) -> tuple[list, tuple[str | None, ...]]:
    """Every job's ``(net, info)`` or None, and why each missing one is missing.

    Like ``fetch_outputs``, but a failed job costs only its own output.
    """
    concurrent.futures.wait(futures)
    outputs, errors = [], []
    for future in futures:
        error = "cancelled" if future.cancelled() else future.exception()
        outputs.append(None if error else future.result())  # may import JAX: jobs ended
        errors.append(str(error).split("\n")[0] if error else None)
    return outputs, tuple(errors)


def _report(depths, infos, errors, table: ProgressTable, stream: TextIO) -> int | None:
    """Print each job's final validation accuracy and timings; the index of the best, or None."""
    print("Final validation accuracy:", file=stream)
    accuracies = [None if i is None else i.final_validation_accuracy for i in infos]
    for i, (depth, info, error) in enumerate(zip(depths, infos, errors)):
        acc = accuracies[i]
        result = f"{acc:.2f}%" if acc is not None else (error or "no validation")
        if info is not None:
            result += f" (compile {info.compile_time:.1f} s, training {info.train_time:.1f} s"
            if i in table.began and i in table.ended:
                result += f"; first step at {table.began[i]:.1f} s, done at {table.ended[i]:.1f} s"
            result += ")"
        print(f"  job {i} (depth {depth}): {result}", file=stream)
    usable = [i for i, acc in enumerate(accuracies) if acc is not None]
    if not usable:
        print("No job finished with a validation accuracy; nothing to test.", file=stream)
        return None
    best = max(usable, key=lambda i: accuracies[i])  # ties: the first, as MATLAB's max
    print(f"Best network: depth {depths[best]} (job {best}, {accuracies[best]:.2f}%)",
          file=stream, flush=True)
    return best


def _evaluate(net, test_codes, plan, depth: int, out: pathlib.Path, stream: TextIO):
    """Test accuracy (%) of ``net`` from the classes its job predicted (``test_codes``)
    for the plan's test set, and the path of its saved confusion chart."""
    from matplotlib.figure import Figure

    from jaxflowers.plots import confusion_chart
    from jaxflowers.predict import Labels, accuracy

    test_set = load_sets(plan)[2] if "source" in plan else load_data(plan["test"])[0]
    predicted = Labels(test_codes, net.class_names)
    test_accuracy = 100.0 * accuracy(predicted, test_set.labels)
    print(f"Test accuracy of depth {depth}: {test_accuracy:.2f}% ({len(test_set)} images)",
          file=stream, flush=True)
    figure = Figure(figsize=(9, 9), layout="tight")  # outside pyplot: nothing left open
    confusion_chart(test_set.labels, predicted.codes, net.class_names, ax=figure.gca(),
                    row_summary="row-normalized", column_summary="column-normalized",
                    title=f"cifar_net depth {depth}: test accuracy {test_accuracy:.2f}%")
    path = out / "confusion_best.png"
    figure.savefig(path, dpi=100)
    print(f"Saved {path} and {out / 'sweep_progress.png'}", file=stream, flush=True)
    return test_accuracy, path
