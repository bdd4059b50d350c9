"""Live plots: training progress and the sweep grid, updated in place in Jupyter.

They draw on a pyplot-free ``Figure`` (so a cell never shows them twice and pyplot never
keeps them alive) and send it as a PNG to one Jupyter output that they update in place;
elsewhere they draw only when saved. The drawing itself is shared with the static charts
in ``jaxflowers.plots``.
"""
from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from jaxflowers.plots import _BLUE, _draw_gpu, _draw_progress, _in_jupyter

__all__ = ["SweepProgressPlot", "TrainingProgressPlot", "sweep_progress"]


class _LivePlot:
    """Base of the live plots: a pyplot-free Figure that subclasses redraw in ``_draw``.

    In Jupyter the figure goes to one output that an IPython display handle updates in
    place (at most every ``min_interval`` s); elsewhere it is drawn only when saved. The
    output holds a PNG, so it works whatever matplotlib backend the notebook uses, and a
    figure outside pyplot is neither shown twice at the end of a cell nor kept alive.
    """

    def __init__(self, *, figsize, min_interval: float):
        from matplotlib.figure import Figure

        self.figure = Figure(figsize=figsize, layout="constrained")
        self._lock = threading.RLock()  # updates may come from a pool's reader thread
        self.min_interval, self._jupyter = float(min_interval), _in_jupyter()
        self._handle, self._last, self._cost, self._stale = None, -math.inf, 0.0, True
        self._draw_share = 0.2  # most of the caller's time a redraw may take, on average
        self._changed(force=True)  # show it (empty) in the cell that created it

    def _draw(self, fig) -> None:
        raise NotImplementedError

    def _changed(self, *, force: bool = False) -> None:
        """Note new data; in Jupyter redraw now unless the last redraw is too recent.

        The pause after a redraw is at least ``min_interval`` and long enough that drawing
        takes no more than ``_draw_share`` of the time of the caller (the training loop).
        """
        with self._lock:
            self._stale = True
            pause = max(self.min_interval, self._cost * (1 / self._draw_share - 1))
            if self._jupyter and (force or time.monotonic() - self._last >= pause):
                self._show()

    def _redraw(self) -> None:
        if self._stale:
            self.figure.clear()
            self._draw(self.figure)
            self._stale = False

    def _show(self) -> None:
        import io

        from IPython.display import Image, display

        start = time.monotonic()
        self._redraw()
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        image = Image(data=buffer.getvalue(), format="png")
        if self._handle is None:
            self._handle = display(image, display_id=True)
        else:
            self._handle.update(image)
        self._last = time.monotonic()
        self._cost = self._last - start

    def save(self, path, **savefig_kwargs) -> None:
        """Draw the latest state and write it (PNG, PDF, ... by the file's extension)."""
        with self._lock:
            self._redraw()
            self.figure.savefig(path, **savefig_kwargs)

    def close(self) -> None:
        """Show the final state (Jupyter) and stop updating the display."""
        with self._lock:
            if self._jupyter and self._stale:
                self._show()
            self._handle, self._jupyter = None, False


class TrainingProgressPlot(_LivePlot):
    """Live training-progress plot (MATLAB: ``trainingOptions(..., Plots="training-progress")``).

    In Jupyter it shows one figure and updates it in place without blocking; elsewhere
    ``update`` only keeps the data until ``save(path)``. ``.figure`` is the Figure.

    Args:
      monitor: optional ``GPUMonitor``; once it has samples a third panel shows each GPU's
        utilisation over time.
      min_interval: least seconds between two redraws.
      smoothing: moving-average weight, as in ``training_progress``.
    """

    def __init__(self, *, monitor=None, min_interval: float = 0.5, smoothing: float = 0.8):
        self.monitor, self.info, self.smoothing = monitor, None, smoothing
        super().__init__(figsize=(8, 7), min_interval=min_interval)

    def update(self, info) -> None:
        """Take the ``TrainingInfo`` so far (fields as in ``training_progress``); cheap."""
        self.info = info
        self._changed()

    def close(self, info=None) -> None:
        """Take the final ``TrainingInfo`` (if given), show it and stop updating."""
        if info is not None:
            self.info = info
            self._stale = True
        super().close()

    def _draw(self, fig) -> None:
        gpu = self.monitor.history() if self.monitor is not None else None
        gpu = gpu if gpu is not None and gpu["time"].size else None
        grid = fig.add_gridspec(3 if gpu else 2, 1, height_ratios=[3, 3, 2][:3 if gpu else 2])
        acc = fig.add_subplot(grid[0])
        acc.tick_params(labelbottom=False)
        _draw_progress(acc, fig.add_subplot(grid[1], sharex=acc), self.info or {},
                       self.smoothing)
        if gpu:
            _draw_gpu(fig.add_subplot(grid[2]), gpu)


@dataclass
class _JobTrace:
    iteration: list = field(default_factory=list)
    accuracy: list = field(default_factory=list)
    validation_iteration: list = field(default_factory=list)
    validation_accuracy: list = field(default_factory=list)
    state: str = "queued"


_STATE_COLORS = {"done": "tab:green", "failed": "tab:red", "cancelled": "tab:gray"}


class SweepProgressPlot(_LivePlot):
    """Live grid with one accuracy panel per sweep job (MATLAB: the ``afterEach`` plots).

    Args:
      num_jobs: number of jobs, int >= 1.
      titles: one name per job (default "Job 0", "Job 1", ...).
      ncols: panels per row.
      min_interval: least seconds between two redraws; ``update`` in between only appends.

    In Jupyter it updates one displayed figure in place; ``save(path)`` writes it.
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
        """Record one progress message of job ``job_index`` (0-based).

        Args:
          message: dict with ``state`` ("start", "iteration", "validation", "done", "failed"
            or "cancelled"); iterations carry ``iteration`` (int) and ``accuracy`` (float,
            %), validations ``iteration`` and ``validation_accuracy`` (float, %). Other keys
            are ignored.
        """
        state = message.get("state", "iteration")
        with self._lock:
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

    def _draw(self, fig) -> None:
        rows = math.ceil(self.num_jobs / self.ncols)
        axes = fig.subplots(rows, self.ncols, squeeze=False).ravel()
        for ax, title, job in zip(axes, self.titles, self.jobs):
            ax.plot(job.iteration, job.accuracy, lw=1, color=_BLUE, label="Training")
            if job.validation_iteration:
                ax.plot(job.validation_iteration, job.validation_accuracy, "--o", ms=3, lw=1,
                        color="black", label="Validation")
            ax.set(ylim=(0, 100), xlabel="Iteration", ylabel="Accuracy (%)")
            ax.set_title(f"{title}: {job.state}", color=_STATE_COLORS.get(job.state, "black"))
            ax.grid(alpha=0.25)
        for ax in axes[self.num_jobs:]:
            ax.set_axis_off()


def sweep_progress(pool, *, titles=None, num_jobs: int | None = None, ncols: int = 2):
    """Live sweep grid fed by a pool's progress messages (MATLAB: ``afterEach`` + plots).

    Args:
      pool: an object with ``after_each(callback)``; the number of jobs comes from
        ``num_jobs=``, else ``pool.num_jobs``, else ``len(pool.futures)``.
      titles: one name per job.

    Returns:
      The ``SweepProgressPlot`` registered with ``pool.after_each``.
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
