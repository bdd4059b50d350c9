"""``run_experiment``: an experiment's missing trials on a pool, then its results.

The data are prepared here before any worker starts; the trials run in a ``Session``; the
best finished trial's network is tested on the test set by one more job (the caller never
imports JAX), and the progress view, the parameter chart, the confusion chart and
``experiment_results.json`` are written to the output folder.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, TextIO

from jaxflowers import recipes
from jaxflowers.plots.backend import in_jupyter
from jaxflowers.sweep.example import report as example_report
from jaxflowers.sweep.experiment import trial as jobs
from jaxflowers.sweep.experiment.session import Session, open_search
from jaxflowers.sweep.experiment.table import format_value

__all__ = ["ExperimentResult", "run_experiment"]

_SHOWN = ("trial", "state", "objective", "stop_reason", "wall_time", "where")


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    """What ``Experiment.run`` leaves: the results table and the best trial, tested."""

    table: Any  # pandas DataFrame, one row per trial, best first (``Experiment.table``)
    best: dict | None  # the best finished trial's row; None when none finished
    test_accuracy: float | None  # the best network on the test set, %
    ran: tuple[int, ...]  # the trial numbers this session ran
    recovered: tuple[int, ...]  # trials a stopped caller left RUNNING, failed to be rerun
    interrupted: bool  # Ctrl-C (or SIGTERM) stopped the session; what finished is kept
    wall_time: float  # seconds of this session
    storage: str  # the SQLAlchemy URL holding the trials (its password hidden)
    paths: dict  # figure and result files written: name -> path


def run_experiment(experiment, pool=None, *, devices="all", jobs_per_device: int = 1,
                   backend: str = "local", address: str | None = None,
                   stream: TextIO | None = None, live: bool = True,
                   test: bool = True) -> ExperimentResult:
    """Run the trials of ``experiment`` not yet finished; returns its results.

    MATLAB: running an experiment in Experiment Manager; a rerun of the same experiment
    (same definition and storage) runs only the trials that have not finished, including
    those a killed caller left running.

    Args:
      experiment: an ``Experiment``.
      pool: a ``DevicePool`` to run on (kept open); None: one made from ``devices``,
        ``jobs_per_device``, ``backend`` and ``address`` (see ``DevicePool``) and shut
        down at the end.
      stream: where progress lines go (default ``sys.stdout``).
      live: draw the progress view (one panel per running trial; in place in Jupyter).
      test: test the best network on the test set and draw its confusion chart.

    Returns:
      An ``ExperimentResult``.
    """
    start, stream = time.perf_counter(), stream or sys.stdout
    out = pathlib.Path(experiment.out_dir)
    _introduce(experiment, stream)
    # the folders' listings: the trials open them instead of listing the folders again
    with tempfile.TemporaryDirectory(prefix="jaxflowers-experiment-data-") as listings:
        share = _prepare(experiment, stream, listings)  # unreadable data fail before the study
        search = open_search(experiment)
        recovered = search.recover()
        _resuming(search, recovered, stream)
        with _open_pool(pool, out, devices, jobs_per_device, backend, address) as pool:
            _check_devices(experiment, pool)
            view = _view(pool) if live else None
            print(f"Running on {pool.num_slots} slot(s) of a {pool.backend} pool; job logs "
                  f"in {pool.log_dir}", file=stream, flush=True)
            session = Session(experiment, search, pool, stream=stream, view=view, share=share)
            interrupted = session.loop()
            table = session.results()
            best = _best(table)
            tested = (_test(experiment, pool, best, stream, share)
                      if test and not interrupted else None)
    paths = _figures(experiment, table, view, tested, out, stream)
    result = ExperimentResult(table, best, tested and tested[0], tuple(session.ran),
                              tuple(recovered), interrupted, time.perf_counter() - start,
                              experiment.storage_shown, paths)
    _report(experiment, result, out, stream)
    return result


def _open_pool(pool, out: pathlib.Path, devices, jobs_per_device, backend, address):
    """``pool`` itself (left open), or a new ``DevicePool`` closed at the end."""
    from jaxflowers.sweep.pool import DevicePool

    if pool is not None:
        return contextlib.nullcontext(pool)
    session = time.strftime(f"%Y%m%d-%H%M%S-{os.getpid()}")
    return DevicePool(devices, jobs_per_device, backend, address=address,
                      log_dir=out / "logs" / session)


def _introduce(experiment, stream: TextIO) -> None:
    print(f"Experiment {experiment.name!r} ({experiment.storage_shown}): {experiment.strategy} "
          f"search, {experiment.num_trials} trials over {', '.join(experiment.design.space)}; "
          f"objective {experiment.objective} ({experiment.goal})", file=stream, flush=True)


def _resuming(search, recovered, stream: TextIO) -> None:
    finished = sum(t.state.name in ("COMPLETE", "PRUNED")
                   for t in search.study.get_trials(deepcopy=False))
    if finished or recovered:
        lost = f", {len(recovered)} left running by a stopped caller (to be rerun)" \
            if recovered else ""
        print(f"Resuming: {finished} trial(s) finished{lost}", file=stream, flush=True)


def _plans(experiment) -> list[dict]:
    """The data plan of each data set the trials use."""
    data = experiment.design.space.get("data")
    sets = list(dict.fromkeys(data.values)) if data is not None else [experiment.design.data]
    return [experiment.design.job({"data": d}, ".")["data"] for d in sets]


def _prepare(experiment, stream: TextIO, listings: str):
    """Build the folders' resize caches here, so the workers only open them, and save their
    listings in ``listings``; returns what maps a trial's plan to the plan naming them."""
    shared = {}
    for index, plan in enumerate(_plans(experiment)):
        print(f"Data: {recipes.describe_plan(plan)}", file=stream, flush=True)
        folder = os.path.join(listings, str(index))
        shared[_plan_key(plan)] = recipes.share_plan(plan, folder)[0]

    def share(plan: dict) -> dict:
        return shared.get(_plan_key(plan), plan)

    return share


def _plan_key(plan: dict) -> str:
    return json.dumps(plan, sort_keys=True)


def _check_devices(experiment, pool) -> None:
    counts = {experiment.design.num_devices(p) for p in (experiment.points or ())}
    varied = experiment.design.space.get("num_devices")
    counts |= {int(v or 1) for v in (varied.extremes() if varied is not None else ())}
    counts.add(experiment.design.num_devices({}))
    if max(counts) > pool.num_devices:
        raise ValueError(f"parameter 'num_devices': trials of {max(counts)} devices do not "
                         f"fit the pool's {pool.num_devices} device(s)")


def _view(pool):
    """One panel per slot: each shows the trial running there, then the next."""
    from jaxflowers.plots.sweep_grid import SweepProgressPlot

    panels = min(pool.num_slots, 16)
    return SweepProgressPlot(panels, ncols=math.ceil(math.sqrt(panels)),
                             titles=[f"Slot {i}" for i in range(panels)])


def _best(table) -> dict | None:
    finished = table[table["state"] == "complete"]
    return None if not len(finished) else finished.iloc[0].to_dict()


def _test(experiment, pool, best, stream: TextIO, share):
    """Test the best network in a job; (facts, a function saving its confusion chart)."""
    if best is None or not best.get("network") or not pathlib.Path(best["network"]).exists():
        return None
    point = {name: _plain(best)[name] for name in experiment.design.space}
    plan = share(experiment.design.job(point, ".")["data"])
    future = pool.submit(jobs.test_job, network=best["network"], data=plan)
    try:
        codes, class_names = future.result()
    except Exception as error:  # noqa: BLE001 (the results stay; only the test is lost)
        print(f"warning: the best network could not be tested: {error}", file=stream)
        return None
    from jaxflowers.inference.labels import accuracy

    test_set = recipes.load_plan(plan)[2]
    score = 100.0 * accuracy(codes, test_set.labels)
    print(f"Test accuracy of trial {best['trial']}: {score:.2f}% ({len(test_set)} images)",
          file=stream, flush=True)
    title = f"Trial {best['trial']}: test accuracy {score:.2f}%"
    return score, functools.partial(_confusion, test_set.labels, codes, class_names, title)


def _confusion(labels, codes, class_names, title: str, path) -> None:
    """Save the confusion chart of ``codes`` against ``labels``, as the example does."""
    from matplotlib.figure import Figure

    from jaxflowers.plots import confusion_chart

    figure = Figure(figsize=(9, 9), layout="tight")  # outside pyplot: nothing left open
    confusion_chart(labels, codes, class_names, ax=figure.gca(), row_summary="row-normalized",
                    column_summary="column-normalized", title=title)
    figure.savefig(path, dpi=100)


def _figures(experiment, table, view, tested, out: pathlib.Path, stream: TextIO) -> dict:
    """Save the progress view, the parameter chart and the confusion chart (each failure
    a warning); returns name -> path of those written."""
    from matplotlib.figure import Figure

    from jaxflowers.plots.experiment import parameter_chart

    log = [n for n, p in experiment.design.space.items() if getattr(p, "log", False)]

    def chart(path):
        figure = parameter_chart(table, list(experiment.design.space), direction=experiment.goal,
                                 log=log, label=experiment.objective, figure=Figure(),
                                 title=f"{experiment.name}: {experiment.objective} of each "
                                       "trial against its parameters")
        figure.savefig(path, dpi=100)

    saves = {"parameters": ("experiment_parameters.png", chart)}
    if view is not None:
        saves["progress"] = ("experiment_progress.png", lambda p: view.save(p, dpi=100))
    if tested is not None:
        saves["confusion"] = ("confusion_best.png", tested[1])
    paths = {name: str(out / file) for name, (file, save) in saves.items()
             if example_report.save_figure(save, out / file)}
    if view is not None:
        view.close()
    if paths:
        print(f"Saved {', '.join(paths.values())}", file=stream, flush=True)
    return paths


def _report(experiment, result: ExperimentResult, out: pathlib.Path, stream: TextIO) -> None:
    """Print the best trials and write ``experiment_results.json``."""
    table = result.table
    names = list(experiment.design.space)
    if len(table) and not in_jupyter():  # Jupyter has shown it, updated in place
        shown = table[[*_SHOWN[:2], *names, *_SHOWN[2:]]].head(10)
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"), file=stream)
    if result.best is not None:
        best = result.best
        print(f"Best: trial {best['trial']}, {experiment.objective} "
              f"{format_value(experiment.objective, best['objective'])}; its network: "
              f"{best.get('network')}", file=stream, flush=True)
    record = {"name": experiment.name, "storage": result.storage,
              "definition": experiment.definition(), "trials": experiment.num_trials,
              "ran": list(result.ran), "recovered": list(result.recovered),
              "interrupted": result.interrupted, "wall_time": result.wall_time,
              "best": _plain(result.best), "test_accuracy": result.test_accuracy,
              "figures": result.paths,
              "states": table["state"].value_counts().to_dict() if len(table) else {}}
    example_report.write_results(out / "experiment_results.json", record)


def _plain(row: dict | None) -> dict | None:
    """A table row as JSON (NaN as None, numpy numbers as Python's)."""
    if row is None:
        return None
    plain = {}
    for key, value in row.items():
        value = value.item() if hasattr(value, "item") else value
        plain[key] = None if isinstance(value, float) and math.isnan(value) else value
    return plain
