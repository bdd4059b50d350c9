"""One session of an experiment: the missing trials run on a ``DevicePool``, side by side.

Each free slot gets the next point not yet finished: Optuna's trial is asked for it, its
job submitted, and every validation the job reports goes to ``trial.report``; when the
pruner says so the trial is stopped through ``Future.cancel`` (the worker is killed) and
told PRUNED. A trial is told COMPLETE, PRUNED or FAIL the moment its job ends, so killing
the caller loses nothing that had finished. The caller never imports JAX: the jobs return
numbers and paths, and the best network is tested by one more job.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import pathlib
import sys
import textwrap
import threading
from typing import Any, Callable, Mapping, TextIO

from jaxflowers.sweep.example.report import save_figure  # any output: a warning if lost
from jaxflowers.sweep.experiment import trial as jobs
from jaxflowers.sweep.experiment.table import LiveTable, frame, rows

__all__ = ["Session", "open_search"]

_SUMMARY = ("final_validation_accuracy", "final_validation_loss", "best_validation_accuracy",
            "best_validation_loss", "iterations", "epochs", "compile_time", "train_time",
            "num_devices", "network", "metrics", "stop_reason")


@dataclasses.dataclass
class _Running:
    """A trial whose job the pool has: its Optuna trial, point, values and progress."""

    trial: Any
    point: int
    values: dict
    future: Any
    panel: int | None = None
    pruned_at: int | None = None
    seen: dict = dataclasses.field(default_factory=dict)  # best validation values so far

    def record(self, message: Mapping) -> None:
        """Keep the best validation accuracy and loss a job has reported."""
        for name, better in (("accuracy", max), ("loss", min)):
            value = message.get(f"validation_{name}")
            if value is not None:
                key = f"best_validation_{name}"
                self.seen[key] = better(self.seen.get(key, value), value)


def open_search(experiment):
    """The experiment's ``search.Search`` in its storage (created when new)."""
    from jaxflowers.sweep.experiment.search import Search

    pathlib.Path(experiment.out_dir).mkdir(parents=True, exist_ok=True)
    return Search(storage=experiment.storage_url, shown=experiment.storage_shown,
                  name=experiment.name,
                  definition=experiment.definition(), space=experiment.design.space,
                  points=experiment.points, trials=experiment.num_trials,
                  direction=experiment.goal, seed=int(experiment.seed),
                  pruner=experiment.pruner)


class Session:
    """Runs the missing trials of ``experiment`` on ``pool`` (see ``run_experiment``)."""

    def __init__(self, experiment, search, pool, *, stream: TextIO, view,
                 share: Callable[[dict], dict] = lambda plan: plan):
        self.experiment, self.search, self.pool, self.view = experiment, search, pool, view
        self.share = share  # a trial's data plan -> the plan naming the caller's listings
        self.design, self.objective = experiment.design, experiment.objective
        self.out = pathlib.Path(experiment.out_dir)
        self.names = list(self.design.space)
        self.table = LiveTable(self.names, self.objective, stream)
        self.lock = threading.RLock()  # Optuna's trials: the caller's thread and the pool's
        self.running: dict[Any, _Running] = {}
        self.by_job: dict[int, _Running] = {}
        self.attempted: set[int] = set()
        self.ran: list[int] = []
        self.per_device = max(1, pool.num_slots // pool.num_devices)
        pool.after_each(self._message)

    def loop(self) -> bool:
        """Run until no point is left; returns whether Ctrl-C (SIGINT/SIGTERM) stopped it."""
        from jaxflowers.sweep.experiment.search import HEARTBEAT

        try:
            while self._fill() or self.running:
                done, _ = concurrent.futures.wait(
                    list(self.running), timeout=HEARTBEAT,
                    return_when=concurrent.futures.FIRST_COMPLETED)
                with self.lock:
                    self.search.heartbeat([run.trial for run in self.running.values()])
                for future in done:
                    self._finish(self.running.pop(future))
            return False
        except KeyboardInterrupt:
            self.pool.terminate()  # (the pool's signal handler has done so already)
            for run in list(self.running.values()):
                self._tell(run, "FAIL", error="interrupted")
            return True

    # ------------------------------------------------------------------ trials

    def _fill(self) -> bool:
        """Submit trials while slots are free; returns whether any was submitted."""
        submitted = False
        while self._used() < self.pool.num_slots:
            with self.lock:
                mine = {run.point for run in self.running.values()} | self.attempted
                point = self.search.next_point(sorted(mine))
                if point is None:
                    return submitted
                self._submit(point)
            submitted = True
        return submitted

    def _used(self) -> int:
        """The slots the running trials take (several devices: every slot of each)."""
        return sum(1 if self.design.num_devices(r.values) == 1 else
                   self.design.num_devices(r.values) * self.per_device
                   for r in self.running.values())

    def _submit(self, point: int) -> None:
        asked = self.search.ask(point)
        if asked is None:  # another caller took it this moment: next_point now knows
            return
        trial, values = asked
        folder = self.out / "trials" / f"trial-{trial.number:04d}"
        job = self.design.job(values, str(folder.resolve()))
        future = self.pool.submit(jobs.trial_job, timeout=self.experiment.timeout,
                                  num_devices=self.design.num_devices(values),
                                  **{**job, "data": self.share(job["data"])})
        run = _Running(trial, point, values, future, panel=self._panel())
        self.running[future], self.by_job[future.job_index] = run, run
        self.attempted.add(point)
        log = pathlib.Path(self.pool.log_dir).resolve() / f"job-{future.job_index:04d}.log"
        trial.set_user_attr("log", str(log))
        if self.view is not None and run.panel is not None:
            settings = ", ".join(f"{k}={_short(v)}" for k, v in values.items())
            self.view.reuse(run.panel, textwrap.fill(f"Trial {trial.number} ({settings})", 48))

    def _panel(self) -> int | None:
        """The progress view's first panel no running trial shows."""
        if self.view is None:
            return None
        used = {run.panel for run in self.running.values()}
        return next((p for p in range(self.view.num_jobs) if p not in used), None)

    def _message(self, job_index: int, message: Mapping) -> None:
        """``after_each``: the live view, the trial's best values, pruning."""
        run = self.by_job.get(job_index)
        if run is None:
            return
        if self.view is not None and run.panel is not None:
            pruned = run.pruned_at is not None and message.get("state") == "cancelled"
            self.view.update(run.panel, {"state": "pruned"} if pruned else message)
        value = message.get(self.objective)
        if message.get("state") != "validation" or value is None or run.pruned_at is not None:
            return
        run.record(message)
        with self.lock:
            if run.future.done():
                return
            prune = self.search.report(run.trial, value, int(message["iteration"]))
            if prune:
                run.pruned_at = int(message["iteration"])
        if prune:
            run.future.cancel()  # kills the worker, as cancel() does for any job

    def _finish(self, run: _Running) -> None:
        """Tell Optuna how a trial's job ended, then show and save the table."""
        future = run.future
        if future.cancelled():
            if run.pruned_at is not None:
                self._tell(run, "PRUNED", pruned_at_iteration=run.pruned_at,
                           iterations=run.pruned_at,
                           stop_reason=f"pruned at iteration {run.pruned_at}")
            else:
                self._tell(run, "FAIL", error="cancelled")
        elif future.exception() is not None:
            self._tell(run, "FAIL", error=str(future.exception()).split("\n")[0])
        else:
            self._tell_result(run, future.result())
        self._show(run.trial.number)

    def _tell_result(self, run: _Running, summary: Mapping) -> None:
        found = {k: summary.get(k) for k in _SUMMARY}
        if summary.get("host") and self.pool.backend != "local":
            found["where"] = f"{summary['host']} ({summary.get('devices')})"
        value = summary.get(f"final_{self.objective}")
        if summary.get("diverged"):
            self._tell(run, "FAIL", error=summary.get("stop_reason"), **found)
        elif value is None:
            self._tell(run, "FAIL", error=f"reported no {self.objective}", **found)
        else:
            self._tell(run, "COMPLETE", value, **found)

    def _tell(self, run: _Running, state: str, value: float | None = None, **attrs) -> None:
        from optuna.trial import TrialState

        slot = run.future.slot  # Ray places its tasks itself: a local slot's words only
        local = slot is not None and self.pool.backend == "local"
        where = {"where": slot.where if local else f"a {self.pool.backend} worker"}
        attrs = {**where, **run.seen, **{k: v for k, v in attrs.items() if v is not None}}
        try:
            with self.lock:
                self.search.tell(run.trial, TrialState[state], value, **attrs)
        except (ValueError, RuntimeError) as error:  # another caller ended it meanwhile
            print(f"warning: trial {run.trial.number} was ended elsewhere (its heartbeat came "
                  f"too late?): {error}", file=sys.stderr, flush=True)
        self.ran.append(run.trial.number)

    def _show(self, trial_number: int) -> None:
        table = self.results()
        self.table.update(table, trial_number)
        save_figure(lambda path: table.to_csv(path, index=False), self.out / "trials.csv")

    def results(self):
        """The results table now (a pandas ``DataFrame``, best first)."""
        with self.lock:
            trials = self.search.study.get_trials(deepcopy=False)
        return frame(rows(trials, self.names), self.names, self.experiment.goal)


def _short(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)

