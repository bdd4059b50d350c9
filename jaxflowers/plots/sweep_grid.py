"""The live sweep grid: accuracy over loss for each job (MATLAB: the ``afterEach`` plots)."""
from __future__ import annotations

import math
import pathlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from jaxflowers.plots.backend import BLUE, RED, LiveFigure
from jaxflowers.plots.training_progress import epoch_spans, percent_axis, shade_span

__all__ = ["SweepProgressPlot", "sweep_progress"]


@dataclass
class _JobTrace:
    iteration: list = field(default_factory=list)
    epoch: list = field(default_factory=list)
    accuracy: list = field(default_factory=list)
    loss: list = field(default_factory=list)
    validation_iteration: list = field(default_factory=list)
    validation_accuracy: list = field(default_factory=list)
    validation_loss: list = field(default_factory=list)
    state: str = "queued"


# Inches: a job's cell (width, height); its axes' margins in it (left: tick labels and the
# y label; top: the job's title; bottom: tick labels and the x label); the figure's title
# above the cells and its legend below them.
_CELL, _MARGINS = (4.8, 4.2), (0.72, 0.18, 0.42, 0.55)
_TOP, _BOTTOM = 0.35, 0.3
# Runs a long training line is drawn in, four points each at most: about one per pixel of a
# cell's axes (3.9 in) in the file (100 dpi).
_BUCKETS = 400

_STATE_COLORS = {"done": "tab:green", "failed": "tab:red", "cancelled": "tab:gray",
                 "pruned": "tab:orange"}


class SweepProgressPlot(LiveFigure):
    """A live grid with accuracy over loss for each sweep job; ignores messages after ``close``.

    Shown inline in Jupyter, in a window that updates where pyplot has a display, else
    rewritten to ``path`` (if given) at each validation and each job's end.

    Args:
      num_jobs: >= 1. titles: one per job (default "Job 0", ...). ncols: jobs per row.
      min_interval: least seconds between two redraws. path: the file to keep up to date.
      title: the figure's title; None: "Training progress of N networks".
    """

    draws_in_place = True

    def __init__(self, num_jobs: int, *, titles=None, ncols: int = 2,
                 min_interval: float = 0.5, path=None, title: str | None = None):
        if int(num_jobs) < 1:
            raise ValueError(f"SweepProgressPlot(num_jobs={num_jobs!r}) needs at least 1 job")
        self.num_jobs, self.ncols = int(num_jobs), max(1, min(int(ncols), int(num_jobs)))
        self.titles = [f"Job {i}" for i in range(self.num_jobs)] if titles is None else [
            str(t) for t in titles]
        if len(self.titles) != self.num_jobs:
            raise ValueError(f"SweepProgressPlot: {len(self.titles)} titles for "
                             f"{self.num_jobs} jobs")
        self.title = (f"Training progress of {self.num_jobs} network"
                      f"{'s' if self.num_jobs > 1 else ''}") if title is None else str(title)
        self.jobs = [_JobTrace() for _ in range(self.num_jobs)]
        self._warned = False
        self._panels: list[_Panel] | None = None  # the cells, laid out at the first draw
        rows = math.ceil(self.num_jobs / self.ncols)
        # Laid out by fixed margins, not a layout engine: the grid is redrawn at every
        # validation and job end, and constrained layout took a third of each redraw.
        super().__init__(figsize=(_CELL[0] * self.ncols, _CELL[1] * rows + _TOP + _BOTTOM),
                         min_interval=min_interval, path=path, layout=None)

    def update(self, job_index: int, message: Mapping) -> None:
        """Record one progress message (``state``: start, iteration, validation, done, failed,
        cancelled or pruned; ``iteration``, ``epoch``, ``[validation_]accuracy`` %,
        ``[validation_]loss``)."""
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
                job.epoch.append(message.get("epoch", 0))
                job.accuracy.append(message.get("accuracy", np.nan))
                job.loss.append(message.get("loss", np.nan))
            val = message.get("validation_accuracy")
            validated = "iteration" in message and val is not None and np.isfinite(val)
            if validated:
                job.validation_iteration.append(message["iteration"])
                job.validation_accuracy.append(val)
                job.validation_loss.append(message.get("validation_loss", np.nan))
            # "start", "iteration" and "validation" all mean the job is running.
            job.state = state if state in _STATE_COLORS else "running"
        self._changed(force=state in _STATE_COLORS, milestone=validated)  # a job's end: now

    def close(self) -> pathlib.Path | None:
        """Show the final state, write ``path`` (if given) unless it already shows it; the
        file or None (it could not be written)."""
        with self._lock:
            super().close()
            if self.path is None:
                return None
            # the last job's end is usually drawn already: a second identical file costs a
            # full render on the sweep's last second
            return self.path if self._file_is_current() or self._write(self.path) else None

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
        # Laid out once; later redraws move the lines, re-shade the epochs that changed and
        # retitle: rebuilding the axes and their ticks was over half of each redraw.
        if self._panels is None:
            self._panels = self._lay_out(fig)
        for panel, title, job in zip(self._panels, self.titles, self.jobs):
            panel.show(title, job)

    def _lay_out(self, fig) -> list[_Panel]:
        from matplotlib.lines import Line2D

        rows = math.ceil(self.num_jobs / self.ncols)
        height = fig.get_figheight()
        # bands for the title and the legend above and below the cells (subfigures take a
        # grid's ratios, not its margins)
        grid = fig.add_gridspec(rows + 2, self.ncols, wspace=0, hspace=0,
                                height_ratios=[_TOP, *[_CELL[1]] * rows, _BOTTOM])
        panels = [_Panel(fig.add_subfigure(grid[1 + k // self.ncols, k % self.ncols]))
                  for k in range(self.num_jobs)]
        fig.suptitle(self.title, fontsize="medium", y=1 - 0.1 / height, va="top")
        handles = [Line2D([], [], lw=1.2, color=BLUE, label="Training accuracy"),
                   Line2D([], [], lw=1.2, color=RED, label="Training loss"),
                   Line2D([], [], ls="--", marker="o", ms=3, lw=1, color="black",
                          label="Validation")]
        fig.legend(handles=handles, loc="lower center", ncols=3, fontsize="small",
                   frameon=False, bbox_to_anchor=(0.5, 0))
        return panels


def _envelope(x, y, buckets: int = _BUCKETS) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` with at most the first, lowest, highest and last point of each of ``buckets``
    runs of equal length, in order: the same picture of a long noisy line at a fraction of
    its points (drawing them was most of a redraw)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.size <= 4 * buckets:
        return x, y
    edges = np.linspace(0, x.size, buckets + 1).astype(np.int64)
    keep = [edges[:-1], edges[1:] - 1]
    for pick in (np.fmin, np.fmax):
        values = pick.reduceat(y, edges[:-1])
        # the first position of each run holding its extreme (NaN runs keep their first);
        # x.size closes the list, so every run finds a position, its own or past its end
        hit = np.append(np.flatnonzero(y == np.repeat(values, np.diff(edges))), x.size)
        at = hit[np.searchsorted(hit, edges[:-1])]
        keep.append(np.where(at < edges[1:], at, edges[:-1]))
    index = np.unique(np.concatenate(keep))
    return x[index], y[index]


class _Panel:
    """One job's cell: accuracy (top) and loss (bottom), every other epoch shaded, its state
    in the title; ``show`` brings the artists up to a trace, as a fresh cell would draw it."""

    def __init__(self, cell):
        from matplotlib.ticker import MaxNLocator

        (left, right, top, bottom), (width, height) = _MARGINS, _CELL
        self.acc, self.loss = cell.subplots(2, 1, sharex=True, gridspec_kw=dict(
            left=left / width, right=1 - right / width, top=1 - top / height,
            bottom=bottom / height, hspace=0.1))
        self.axes = (self.acc, self.loss)
        self.training = [ax.plot([], [], lw=1, color=color)[0]
                         for ax, color in zip(self.axes, (BLUE, RED))]
        self.validation = [ax.plot([], [], "--o", ms=3, lw=1, color="black")[0]
                           for ax in self.axes]
        for ax in self.axes:
            ax.grid(alpha=0.25)
        percent_axis(self.acc)
        self.acc.set_ylabel("Accuracy (%)")
        self.loss.set(xlabel="Iteration", ylabel="Loss")
        self.loss.xaxis.set_major_locator(MaxNLocator(integer=True))
        self.title = cell.suptitle("", fontsize="medium")
        self.shaded: list[tuple] = []  # (the epoch's bounds, its patches) of each shaded epoch

    def show(self, title: str, job: _JobTrace) -> None:
        for line, values in zip(self.training, (job.accuracy, job.loss)):
            line.set_data(*_envelope(job.iteration, values))
        for line, values in zip(self.validation, (job.validation_accuracy,
                                                  job.validation_loss)):
            line.set_data(job.validation_iteration, values)
        spans = epoch_spans({"iteration": job.iteration, "epoch": job.epoch})[1::2]
        kept = 0  # re-shade from the first epoch whose bounds changed (the running one)
        while kept < min(len(spans), len(self.shaded)) and spans[kept] == self.shaded[kept][0]:
            kept += 1
        for _, patches in self.shaded[kept:]:
            for patch in patches:
                patch.remove()
        self.shaded[kept:] = [(span, shade_span(self.axes, *span[:2])) for span in spans[kept:]]
        for ax in self.axes:  # both limits first: the two axes share x
            ax.relim()
        for ax in self.axes:
            ax.autoscale_view()
        self.title.set_text(f"{title}: {job.state}")
        self.title.set_color(_STATE_COLORS.get(job.state, "black"))


def sweep_progress(pool, *, titles=None, num_jobs: int | None = None, ncols: int = 2,
                   path=None, title: str | None = None) -> SweepProgressPlot:
    """A ``SweepProgressPlot`` fed by ``pool.after_each`` (MATLAB: ``afterEach`` + plots).

    Args:
      pool: has ``after_each(callback)`` and ``num_jobs`` or ``futures`` (else pass ``num_jobs``).
      titles, ncols, path, title: as ``SweepProgressPlot``.

    Returns:
      The plot; ``close()`` it when the jobs are done.
    """
    if num_jobs is None:
        num_jobs = getattr(pool, "num_jobs", None)
    if num_jobs is None and getattr(pool, "futures", None) is not None:
        num_jobs = len(pool.futures)
    if num_jobs is None:
        raise ValueError("sweep_progress: pass num_jobs=, the pool has neither num_jobs nor "
                         "futures")
    plot = SweepProgressPlot(num_jobs, titles=titles, ncols=ncols, path=path, title=title)
    pool.after_each(lambda job_index, message: plot.update(job_index, message))
    return plot
