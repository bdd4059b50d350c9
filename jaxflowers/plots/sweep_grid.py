"""The live sweep grid: one accuracy panel per job (MATLAB: the ``afterEach`` plots)."""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from jaxflowers.plots.backend import BLUE, LiveFigure

__all__ = ["SweepProgressPlot", "sweep_progress"]


@dataclass
class _JobTrace:
    iteration: list = field(default_factory=list)
    accuracy: list = field(default_factory=list)
    validation_iteration: list = field(default_factory=list)
    validation_accuracy: list = field(default_factory=list)
    state: str = "queued"


_STATE_COLORS = {"done": "tab:green", "failed": "tab:red", "cancelled": "tab:gray",
                 "pruned": "tab:orange"}


class SweepProgressPlot(LiveFigure):
    """A live grid of one accuracy panel per sweep job; ignores messages after ``close``.

    Args:
      num_jobs: >= 1. titles: one per job (default "Job 0", ...). ncols: panels per row.
      min_interval: least seconds between two redraws.
    """

    def __init__(self, num_jobs: int, *, titles=None, ncols: int = 2,
                 min_interval: float = 0.5):
        if int(num_jobs) < 1:
            raise ValueError(f"SweepProgressPlot(num_jobs={num_jobs!r}) needs at least 1 job")
        self.num_jobs, self.ncols = int(num_jobs), max(1, min(int(ncols), int(num_jobs)))
        self.titles = [f"Job {i}" for i in range(self.num_jobs)] if titles is None else [
            str(t) for t in titles]
        if len(self.titles) != self.num_jobs:
            raise ValueError(f"SweepProgressPlot: {len(self.titles)} titles for "
                             f"{self.num_jobs} jobs")
        self.jobs = [_JobTrace() for _ in range(self.num_jobs)]
        self._warned = False
        rows = math.ceil(self.num_jobs / self.ncols)
        super().__init__(figsize=(4.5 * self.ncols, 3.2 * rows), min_interval=min_interval)

    def update(self, job_index: int, message: Mapping) -> None:
        """Record one progress message (``state``: start, iteration, validation, done, failed,
        cancelled or pruned; ``iteration``, ``[validation_]accuracy`` %)."""
        state = message.get("state", "iteration")
        with self._lock:
            if self.closed:  # the grid shows the jobs it was made for, as they ended
                return
            if not 0 <= job_index < self.num_jobs:
                if not self._warned:
                    warnings.warn(f"SweepProgressPlot: ignoring job {job_index}, the plot has "
                                  f"{self.num_jobs} panels", stacklevel=2)
                self._warned = True
                return
            job = self.jobs[job_index]
            if state == "iteration" and "iteration" in message:
                job.iteration.append(message["iteration"])
                job.accuracy.append(message.get("accuracy", np.nan))
            val = message.get("validation_accuracy")
            if "iteration" in message and val is not None and np.isfinite(val):
                job.validation_iteration.append(message["iteration"])
                job.validation_accuracy.append(val)
            # "start", "iteration" and "validation" all mean the job is running.
            job.state = state if state in _STATE_COLORS else "running"
        self._changed(force=state in _STATE_COLORS)  # always show a job's end at once

    def reuse(self, job_index: int, title: str) -> None:
        """Clear panel ``job_index`` and name it ``title``: a panel shows one job, then the
        next (a view of the running trials of an experiment)."""
        with self._lock:
            if self.closed or not 0 <= job_index < self.num_jobs:
                return
            self.jobs[job_index] = _JobTrace(state="running")
            self.titles[job_index] = str(title)
        self._changed(force=True)

    def _draw(self, fig) -> None:
        from matplotlib.lines import Line2D

        rows = math.ceil(self.num_jobs / self.ncols)
        axes = fig.subplots(rows, self.ncols, squeeze=False).ravel()
        for ax, title, job in zip(axes, self.titles, self.jobs):
            ax.plot(job.iteration, job.accuracy, lw=1, color=BLUE, label="Training")
            if job.validation_iteration:
                ax.plot(job.validation_iteration, job.validation_accuracy, "--o", ms=3, lw=1,
                        color="black", label="Validation")
            ax.set(ylim=(0, 100), xlabel="Iteration", ylabel="Accuracy (%)")
            ax.set_title(f"{title}: {job.state}", color=_STATE_COLORS.get(job.state, "black"))
            ax.grid(alpha=0.25)
        axes[0].legend(handles=[Line2D([], [], lw=1, color=BLUE, label="Training"),
                                Line2D([], [], ls="--", marker="o", ms=3, lw=1, color="black",
                                       label="Validation")],
                       loc="lower right", fontsize="x-small")
        for ax in axes[self.num_jobs:]:
            ax.set_axis_off()


def sweep_progress(pool, *, titles=None, num_jobs: int | None = None, ncols: int = 2):
    """A ``SweepProgressPlot`` fed by ``pool.after_each`` (MATLAB: ``afterEach`` + plots).

    Args:
      pool: has ``after_each(callback)`` and ``num_jobs`` or ``futures`` (else pass ``num_jobs``).
      titles, ncols: as ``SweepProgressPlot``.
    """
    if num_jobs is None:
        num_jobs = getattr(pool, "num_jobs", None)
    if num_jobs is None and getattr(pool, "futures", None) is not None:
        num_jobs = len(pool.futures)
    if num_jobs is None:
        raise ValueError("sweep_progress: pass num_jobs=, the pool has neither num_jobs nor "
                         "futures")
    plot = SweepProgressPlot(num_jobs, titles=titles, ncols=ncols)
    pool.after_each(lambda job_index, message: plot.update(job_index, message))
    return plot
