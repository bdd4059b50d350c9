"""MATLAB's "Use parfeval to Train Multiple Deep Learning Networks", end to end.

Nothing here imports JAX before the jobs are submitted: a caller that started a GPU backend
would hold memory on the GPUs its workers need.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import tempfile
import threading
import time
from typing import Any, Mapping, Sequence, TextIO

from jaxflowers import recipes
from jaxflowers.host import signals
from jaxflowers.sweep import channel, transfer
from jaxflowers.sweep.events import Relay
from jaxflowers.sweep.example import report as results
from jaxflowers.sweep.example.data import example_plan
from jaxflowers.sweep.example.ends import JobEnds
from jaxflowers.sweep.example.report import ProgressTable
from jaxflowers.sweep.futures import wait_jobs
from jaxflowers.sweep.jobs import job_options, train_job
from jaxflowers.sweep.pool import DevicePool

__all__ = ["SweepResult", "depth_job", "run_sweep"]


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """What ``run_sweep`` found; per-job tuples are aligned with ``depths``."""

    depths: tuple[int, ...]  # the cifar_net depth of each job
    validation_accuracies: tuple[float | None, ...]  # final validation accuracy, %; None: failed
    errors: tuple[str | None, ...]  # why a job failed ("cancelled", first error line,
    #                                 "training loss is NaN at iteration k") or None
    best_depth: int | None  # depth of the best network; None when every job failed
    test_accuracy: float | None  # the best network's test-set accuracy, %
    wall_time: float  # seconds, data checks to saved plots
    confusion_path: pathlib.Path | None  # the best network's confusion chart (PNG), if saved
    progress_path: pathlib.Path | None  # the 2 x 2 (or larger) progress grid (PNG), if saved
    results_path: pathlib.Path | None  # sweep_results.json, if written
    log_dir: pathlib.Path  # one log per job: its MATLAB-style table and any traceback
    interrupted: str | None = None  # "SIGINT" or "SIGTERM" stopped it; finished jobs are kept
    best_net: Any = dataclasses.field(default=None, repr=False)  # the best TrainedNet


# ---------------------------------------------------------------- the job

def depth_job(*, data: Mapping, depth: int, max_epochs: int = 30, seed: int = 0,
              options_overrides: Mapping | None = None):
    """One job: ``cifar_net(depth)`` with the example's options (MATLAB: ``trainNetwork``).

    Args:
      data: an ``example_plan``; the worker loads and splits the data itself.
      depth: convolutions per block of ``cifar_net``.
      max_epochs: training epochs.
      seed: initialisation, shuffling and augmentation.
      options_overrides: ``TrainingOptions`` fields replacing the "sweep" recipe's.

    Returns:
      ``(net, info, test_codes)``: ``train_job``'s output and the predicted class (int32) of
      each test image (None for a diverged run).
    """
    import numpy as np

    from jaxflowers.inference.predict import predict

    train_set, validation_set, test_set = recipes.load_plan(data)
    overrides = dict(options_overrides or {})
    if "mini_batch_size" in overrides:  # keep validating once per epoch
        overrides.setdefault("validation_frequency",
                             max(1, len(train_set) // int(overrides["mini_batch_size"])))
    options = recipes.recipe("sweep").options(1, len(train_set), max_epochs=max_epochs)
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    net, info = train_job(data={"train": train_set, "validation": validation_set},
                          model=("cifar_net", {"depth": depth}),
                          options={**fields, **overrides}, seed=seed)
    if info.diverged:  # never chosen as the best: nothing to test
        return net, info, None
    # tested here, on the GPU the job holds: the caller never starts JAX on the GPUs
    test_codes = np.argmax(predict(net, test_set), axis=1).astype(np.int32)
    channel.mark("test predicted")
    print(f"Predicted the {len(test_set)} test images", flush=True)
    return net, info, test_codes


# ---------------------------------------------------------------- the sweep

def run_sweep(depths: Sequence[int] = (1, 2, 3, 4), *, data: str = "digits", epochs: int = 30,
              devices="all", jobs_per_device: int | str = 1, mps: bool | str = "auto",
              out_dir: str | os.PathLike = ".",
              seed: int = 0, stream: TextIO | None = None,
              options_overrides: Mapping | None = None) -> SweepResult:
    """Train ``cifar_net`` of each depth side by side, pick the best, test it, plot it.

    MATLAB: "Use parfeval to Train Multiple Deep Learning Networks" (through ``confusionchart``).

    Args:
      depths: one job per depth (ints >= 1).
      data: "digits" (embedded, offline), "cifar10" or a folder (see ``example_plan``).
      epochs: training epochs per job.
      devices, jobs_per_device, mps: the ``DevicePool``'s slots and how packed jobs share
        a GPU.
      out_dir: folder of ``sweep_results.json``, the metrics CSVs, the PNGs and ``sweep-logs/``.
      seed: data splits, initialisation, shuffling and augmentation.
      stream: where the table and results are printed (default ``sys.stdout``).
      options_overrides: ``TrainingOptions`` (or ``ExecutionOptions``) fields for every job.

    Returns:
      A :class:`SweepResult`; failed jobs are never chosen, and after Ctrl-C or SIGTERM what
      finished is still reported and saved (``interrupted``).

    Raises (before any job starts):
      DataUnavailableError: ``data`` cannot be loaded.
      ValueError: no depth, a depth or ``epochs`` below 1, or a bad option.
      OSError: ``out_dir`` cannot be created.
    """
    start, stream = time.perf_counter(), stream or sys.stdout
    depths = tuple(int(d) for d in depths)
    if not depths or min(depths) < 1 or int(epochs) < 1:
        raise ValueError(f"run_sweep(depths={depths}, epochs={epochs}): need at least one "
                         "depth, every depth and epochs >= 1")
    overrides = dict(options_overrides or {})
    job_options(overrides)  # a bad option fails here, not in every worker
    plan = example_plan(data, seed=seed)
    out = _output_folder(out_dir)
    print(f"Data: {recipes.describe_plan(plan)}", file=stream)
    # the folders' listings: the jobs (and the test below) open them instead of listing again
    with tempfile.TemporaryDirectory(prefix="jaxflowers-sweep-data-") as listings:
        # The pool first: its warm workers start up while the data are prepared.
        with signals.sigterm_raises(), DevicePool(devices, jobs_per_device, mps=mps,
                                                  log_dir=out / "sweep-logs") as pool:
            plan = _prepare(plan, stream, listings)  # the workers open finished caches, listed
            if pool.sharing:
                together = "together under MPS" if pool.sharing == "mps" else "in turns"
                count = ("as many as fit (jobs_per_device='auto')" if jobs_per_device == "auto"
                         else jobs_per_device)
                print(f"Jobs on each GPU: {count}, running {together}", file=stream)
            relay = pool.after_each(Relay())  # the jobs start while the figure is made
            futures = [pool.submit(depth_job, data=plan, depth=d, max_epochs=epochs, seed=seed,
                                   options_overrides=overrides) for d in depths]
            plot, table = _watch(pool, relay, depths, stream, start, out / "sweep_progress.png")
            ends = JobEnds(futures, depths, plan, out)  # each job's outputs as it ends
            interrupted = _wait(futures, pool, stream)
        outputs, outcomes = ends.results()
        best = results.print_outcomes(outcomes, table, stream)
        test = best_net = None
        if best is not None:
            best_net = outputs[best][0]
            test = ends.test(best, outputs)
            print(f"Test accuracy of depth {test.depth}: {test.accuracy:.2f}% "
                  f"({test.images} images)", file=stream, flush=True)
    wall = time.perf_counter() - start
    facts = dict(data=recipes.describe_plan(plan), epochs=int(epochs), seed=seed,
                 interrupted=interrupted, wall_time=wall, log_dir=str(pool.log_dir))
    summary = results.summary(outcomes, best=best, test=test and test.facts,
                              metrics=ends.metrics, **facts)
    results_path = out / "sweep_results.json"
    results_path = results_path if results.write_results(results_path, summary) else None
    progress_path, confusion_path = _save_figures(plot, test, out, stream)
    return SweepResult(depths, tuple(o.accuracy for o in outcomes),
                       tuple(o.error for o in outcomes), None if best is None else depths[best],
                       test and test.accuracy, wall, confusion_path, progress_path,
                       results_path, pool.log_dir, interrupted, best_net)


def _output_folder(out_dir) -> pathlib.Path:
    out = pathlib.Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OSError(f"cannot write the sweep's outputs to {out_dir}: "
                      f"{error.strerror or error}") from error
    return out


def _prepare(plan: Mapping, stream: TextIO, listings: str) -> dict:
    """``recipes.share_plan`` into the folder ``listings``, and one line saying how long it
    took; the plan the jobs get."""
    start = time.perf_counter()
    plan, folders = recipes.share_plan(plan, listings)
    what = (f"{sum(map(len, folders)):,} images in {len(folders)} resize cache(s)" if folders
            else "nothing to decode")
    print(f"Prepared the data in {time.perf_counter() - start:.1f} s ({what})", file=stream,
          flush=True)
    return plan


def _watch(pool: DevicePool, relay: Relay, depths: tuple[int, ...], stream: TextIO,
           start: float | None = None, path: pathlib.Path | None = None):
    """Attach the live table and the progress grid (kept up to date in ``path`` without a
    display) to ``relay``, which has every job's messages since the first; both."""
    from jaxflowers.plots.sweep_grid import sweep_progress  # matplotlib, no JAX

    plot = sweep_progress(relay, num_jobs=len(depths), titles=[f"Depth {d}" for d in depths],
                          path=path, title=f"cifar_net of depths {', '.join(map(str, depths))}")
    print(f"Training {len(depths)} networks (cifar_net depths {', '.join(map(str, depths))}) "
          f"on {pool.num_slots} slot(s) of a {pool.backend} pool; job logs in {pool.log_dir}",
          file=stream)
    table = ProgressTable(depths, stream, start)
    table.header()
    relay.after_each(table)
    relay.after_each(_ImportWhileTraining())
    relay.seal()
    return plot, table


class _ImportWhileTraining:
    """An ``after_each`` listener: at a job's first step (the workers' start-ups are over, so
    it takes no CPU from them) run ``transfer.import_for_rebuild`` in a thread, so that
    fetching the results does not wait for JAX's import."""

    def __init__(self):
        self.started = False

    def __call__(self, job_index: int, message: dict) -> None:
        if self.started or message.get("state") != "iteration":
            return
        self.started = True
        threading.Thread(target=transfer.import_for_rebuild, name="jaxflowers-result-imports",
                         daemon=True).start()


def _wait(futures, pool: DevicePool, stream: TextIO) -> str | None:
    """Wait for every job; on SIGINT or SIGTERM cancel the rest and return "SIGINT"/"SIGTERM"."""
    try:
        wait_jobs(futures)  # drawing the grid's window meanwhile, if it has one
        return None
    except KeyboardInterrupt as stop:
        pool.terminate()  # (the pool's signal handler has done so already)
        print(f"{signals.signal_words(stop, capital=True)}: the jobs still running are "
              "cancelled; reporting those that finished", file=stream, flush=True)
        return "SIGTERM" if isinstance(stop, signals.Terminated) else "SIGINT"


def _save_figures(plot, test, out: pathlib.Path, stream: TextIO):
    """Save the progress grid's last frame and the confusion chart; the paths written (None:
    failed, with a warning)."""
    saved = [plot.close()]
    saved.append(out / "confusion_best.png" if test else None)
    if test and not results.save_figure(test.save, saved[1]):
        saved[1] = None
    written = [str(path) for path in saved if path is not None]
    if written:
        print(f"Saved {' and '.join(written)}", file=stream, flush=True)
    return tuple(saved)
