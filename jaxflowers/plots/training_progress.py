"""The training-progress view (MATLAB: ``Plots="training-progress"``): ``train``'s live
``TrainingProgressPlot``, and ``training_progress`` for a finished ``info``.
"""
from __future__ import annotations

import dataclasses
import datetime
import pathlib
import sys
import time
from collections.abc import Mapping

import numpy as np

from jaxflowers.host.clock import hms
from jaxflowers.options.training import METRIC_NAMES
from jaxflowers.plots.backend import BLUE, RED, LiveFigure, has_window, in_jupyter, pyplot

__all__ = ["DEFAULT_PATH", "RunFacts", "TrainingProgressPlot", "draw_figure",
           "draw_panels", "epoch_spans", "info_lines", "percent_axis", "shade_epochs",
           "training_progress"]

DEFAULT_PATH = "training_progress.png"  # without a display or a path: in the working folder
_MAX_EPOCH_LABELS = 12  # more epochs than this get every k-th label


@dataclasses.dataclass
class RunFacts:
    """What the information panel says beyond ``info``; None where unknown."""

    max_epochs: int | None = None
    iterations_per_epoch: int | None = None
    validation_frequency: int | None = None  # iterations between validations
    hardware: str | None = None  # e.g. "4 x NVIDIA H200 (shard_map)"
    metrics: tuple[str, ...] = ()  # validation metrics drawn in panels of their own
    start: float | None = None  # time.time() when training started
    end: float | None = None  # time.time() when it ended; None while running

    @property
    def total_iterations(self) -> int | None:
        if self.max_epochs and self.iterations_per_epoch:
            return self.max_epochs * self.iterations_per_epoch
        return None


def _field(info, name: str) -> np.ndarray:
    """``info.name`` (or ``info[name]``) as a 1-D array; empty where absent or None."""
    value = info.get(name) if isinstance(info, Mapping) else getattr(info, name, None)
    return np.asarray([] if value is None else value).reshape(-1)


def _smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """Exponential moving average, bias-corrected like TensorBoard's; NaNs are skipped."""
    out, avg, seen = np.full(len(values), np.nan), 0.0, 0
    for i, value in enumerate(values):
        if np.isfinite(value):
            avg, seen = weight * avg + (1 - weight) * value, seen + 1
        if seen:
            out[i] = avg / (1 - weight**seen)
    return out


def _facts(info, facts: RunFacts | None) -> RunFacts:
    """``facts`` with what is unknown there taken from ``info`` (a finished run's record)."""
    facts = dataclasses.replace(facts) if facts is not None else RunFacts()
    for name in ("max_epochs", "iterations_per_epoch"):
        value = _field(info, name)
        if getattr(facts, name) is None and value.size:
            setattr(facts, name, int(value[0]))
    if not facts.metrics:
        facts.metrics = tuple(_metrics(info))
    return facts


def _metrics(info) -> dict:
    """``info.validation_metrics``: {name: (V,) values}, empty where absent."""
    metrics = (info.get("validation_metrics") if isinstance(info, Mapping)
               else getattr(info, "validation_metrics", None))
    return dict(metrics or {})


def epoch_spans(info, facts: RunFacts | None = None) -> list[tuple[float, float, int]]:
    """(first, last, epoch) bounds of every planned (else recorded) epoch, between iterations."""
    facts = facts or RunFacts()
    ipe = facts.iterations_per_epoch
    if ipe:
        done = int(_field(info, "epoch").max(initial=1))
        count = max(facts.max_epochs or done, done)
        return [(k * ipe + 0.5, (k + 1) * ipe + 0.5, k + 1) for k in range(count)]
    it, ep = _field(info, "iteration"), _field(info, "epoch")
    if it.size == 0 or it.size != ep.size:
        return []
    starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
    ends = np.r_[it[starts[1:]] - 0.5, it[-1] + 0.5]
    return [(it[s] - 0.5, e, int(ep[s])) for s, e in zip(starts, ends)]


def shade_epochs(panels, spans) -> None:
    """Shade every other epoch of ``spans`` ((first, last, epoch) bounds) on each panel."""
    for ax in panels:
        for first, last, _ in spans[1::2]:
            ax.axvspan(first, last, color="0.5", alpha=0.08, lw=0, gid="epoch")


def _draw_epochs(panels, spans) -> None:
    """Shade every other epoch; number the epochs on the top panel's top axis."""
    shade_epochs(panels, spans)
    if not spans:
        return
    nice = (m * 10**k for k in range(9) for m in (1, 2, 5))  # 1, 2, 5, 10, 20, 50, ...
    every = next(step for step in nice if len(spans) <= step * _MAX_EPOCH_LABELS)
    shown = [span for span in spans if every == 1 or span[2] % every == 0]
    top = panels[0].secondary_xaxis("top")
    top.set_gid("epochs")
    top.set_xticks([(a + b) / 2 for a, b, _ in shown], [str(e) for *_, e in shown])
    top.tick_params(length=0, labelsize="small")
    top.set_xlabel("Epoch", fontsize="small")


def _draw_curves(acc, loss, info, smoothing: float) -> None:
    it, val_it = _field(info, "iteration"), _field(info, "validation_iteration")
    for ax, key, ylabel, color in ((acc, "accuracy", "Accuracy (%)", BLUE),
                                   (loss, "loss", "Loss", RED)):
        y, val = _field(info, key), _field(info, "validation_" + key)
        n, m = min(it.size, y.size), min(val_it.size, val.size)
        ax.plot(it[:n], y[:n], lw=0.6, alpha=0.4, color=color, label="Training")
        ax.plot(it[:n], _smooth(y[:n], smoothing), lw=1.6, color=color,
                label="Training (smoothed)")
        ax.plot(val_it[:m], val[:m], "--o", ms=4, lw=1, color="black", label="Validation")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.25)
    percent_axis(acc)
    acc.legend(loc="best", fontsize="small")
    loss.legend(loc="best", fontsize="small")


def percent_axis(ax) -> None:
    """0-100 % with headroom, so a line at 100 % stays off the frame."""
    ax.set_ylim(-2, 104)
    ax.set_yticks(range(0, 101, 20))


def _draw_metric(ax, info, name: str) -> None:
    """The validation values of one metric (fractions in [0, 1])."""
    values = np.asarray(_metrics(info).get(name, []), dtype=np.float64).reshape(-1)
    iterations = _field(info, "validation_iteration")[:values.size]
    ax.plot(iterations, values[:iterations.size], "--o", ms=4, lw=1, color="black",
            label="Validation")
    ax.set(ylim=(-0.02, 1.04), ylabel=METRIC_NAMES.get(name, name))
    ax.grid(alpha=0.25)


def draw_panels(acc, loss, info, facts: RunFacts | None = None, *, smoothing: float = 0.8,
                metric_axes=()) -> None:
    """MATLAB's accuracy and loss panels (and one per metric) with epochs labelled, into the
    given Axes; the last of them gets the iteration axis."""
    facts = _facts(info, facts)
    _draw_curves(acc, loss, info, smoothing)
    for ax, name in zip(metric_axes, facts.metrics):
        _draw_metric(ax, info, name)
    panels = [acc, loss, *metric_axes]
    _draw_epochs(panels, epoch_spans(info, facts))
    if facts.total_iterations:
        acc.set_xlim(0.5, facts.total_iterations + 0.5)
    from matplotlib.ticker import MaxNLocator

    for ax in panels:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations are whole
    panels[-1].set_xlabel("Iteration")


def _of(value, total) -> str:
    return f"{value}" if total is None else f"{value} of {total}"


def info_lines(info, facts: RunFacts, *, final: bool) -> list[tuple[str, str | None]]:
    """The information panel as (label, value) pairs; a value of None starts a section."""
    facts = _facts(info, facts)
    return [*_time_lines(info, facts), *_cycle_lines(info, facts),
            *_validation_lines(info, facts, final), *_other_lines(info, facts, final)]


def _time_lines(info, facts: RunFacts) -> list:
    lines: list = [("Training time", None)]
    if facts.start is not None:
        start = datetime.datetime.fromtimestamp(facts.start)
        elapsed = (facts.end if facts.end is not None else time.time()) - facts.start
        lines += [("Start time", start.strftime("%Y-%m-%d %H:%M:%S")),
                  ("Elapsed", hms(elapsed))]
    elif _field(info, "train_time").size:  # a finished info drawn on its own
        lines.append(("Elapsed", hms(float(_field(info, "train_time")[0]))))
    return lines


def _cycle_lines(info, facts: RunFacts) -> list:
    it, ep = _field(info, "iteration"), _field(info, "epoch")
    lines = [("Training cycle", None),
             ("Epoch", _of(int(ep[-1]) if ep.size else 0, facts.max_epochs)),
             ("Iteration", _of(int(it[-1]) if it.size else 0, facts.total_iterations))]
    if facts.iterations_per_epoch:
        lines.append(("Per epoch", f"{facts.iterations_per_epoch} iterations"))
    return lines


def _validation_lines(info, facts: RunFacts, final: bool) -> list:
    accuracy, loss = _field(info, "validation_accuracy"), _field(info, "validation_loss")
    lines: list = [("Validation", None)]
    if facts.validation_frequency:
        lines.append(("Frequency", f"every {facts.validation_frequency} iterations"))
    if accuracy.size and loss.size:
        return lines + [("Accuracy", f"{accuracy[-1]:.2f}%"), ("Loss", f"{loss[-1]:.4f}")]
    return lines + [("Accuracy", "not validated" if final else "none yet")]


def _other_lines(info, facts: RunFacts, final: bool) -> list:
    devices, lr = _field(info, "num_devices"), _field(info, "learn_rate")
    reason = _field(info, "stop_reason")
    count = int(devices[0]) if devices.size else 0
    hardware = facts.hardware or (f"{count} device{'s' if count > 1 else ''}" if count
                                  else "unknown")
    lines = [("Other information", None), ("Hardware", hardware),
             ("Learning rate", f"{lr[-1]:.4g}" if lr.size else "-"),
             ("Result", None),
             ("Stop reason", str(reason[0]) if final and reason.size else "training")]
    returned = getattr(info, "final_validation_accuracy", None) if final else None
    if returned is not None:  # the returned network's (best or final, batch norm finalised)
        lines.append(("Final validation", f"{returned:.2f}%"))
    return lines


def _draw_info(ax, lines) -> None:
    ax.set_axis_off()
    step = 1.0 / (len(lines) + 1)
    for row, (label, value) in enumerate(lines):
        y = 1.0 - row * step
        if value is None:
            ax.text(0.0, y, label, weight="bold", va="top", fontsize="small",
                    transform=ax.transAxes)
        else:
            ax.text(0.04, y, label, va="top", fontsize="small", color="0.3",
                    transform=ax.transAxes)
            ax.text(0.52, y, value, va="top", fontsize="small", transform=ax.transAxes,
                    gid=label)


def _draw_gpu(ax, history: dict) -> None:
    for g, index in enumerate(history["device"]):
        ax.plot(history["time"], history["utilization"][:, g], lw=1, label=f"GPU {index}")
    ax.set(ylim=(0, 105), xlabel="Time (s)", ylabel="GPU use (%)")
    ax.legend(loc="lower right", fontsize="x-small", ncols=min(len(history["device"]), 4))
    ax.grid(alpha=0.25)


def draw_figure(fig, info, facts: RunFacts, *, final: bool, smoothing: float = 0.8,
                gpu: dict | None = None) -> None:
    """The whole view into ``fig``: accuracy, loss, a panel per metric (and GPU use) left, the
    information panel right."""
    facts = _facts(info, facts)
    heights = (3, 3, *(1.6,) * len(facts.metrics), *((2,) if gpu else ()))
    grid = fig.add_gridspec(len(heights), 2, width_ratios=(3.2, 1), height_ratios=heights)
    acc = fig.add_subplot(grid[0, 0])
    shared = [fig.add_subplot(grid[row, 0], sharex=acc)
              for row in range(1, 2 + len(facts.metrics))]
    for ax in (acc, *shared[:-1]):
        ax.tick_params(labelbottom=False)
    draw_panels(acc, shared[0], info, facts, smoothing=smoothing, metric_axes=shared[1:])
    panel = fig.add_subplot(grid[:, 1])
    panel.set_gid("information")
    _draw_info(panel, info_lines(info, facts, final=final))
    if gpu:
        _draw_gpu(fig.add_subplot(grid[-1, 0]), gpu)
    fig.suptitle("Training progress", fontsize="medium")


def _figure_height(metrics=(), gpu: bool = False) -> float:
    """Inches for ``draw_figure``'s panels: 6, and more for metrics and GPU use."""
    return 6 + 1.4 * len(metrics) + 1.5 * bool(gpu)


def _summary(lines) -> str:
    """The information panel as one line of text (the saved PNG's description)."""
    return "; ".join(f"{label}: {value}" for label, value in lines if value is not None)


def training_progress(info, *, ax=None, smoothing: float = 0.8):
    """A Figure of accuracy, loss and each metric against iteration (MATLAB: the
    "training-progress" plot).

    Args:
      info: a ``TrainingInfo`` or mapping: ``iteration``, ``epoch``, ``loss``, ``accuracy`` (%)
        (I,); ``validation_iteration``, ``validation_loss``, ``validation_accuracy`` (V,);
        optionally ``validation_metrics`` ({name: (V,)}), ``max_epochs``, ``num_devices``.
      ax: None for a figure with the information panel, or (accuracy, loss) Axes.
      smoothing: moving-average weight in [0, 1) over the mini-batch values (0: none).

    Returns:
      The matplotlib Figure.
    """
    if ax is not None:
        draw_panels(ax[0], ax[1], info, smoothing=smoothing)
        return ax[0].figure
    facts = _facts(info, None)
    fig = pyplot().figure(figsize=(11, _figure_height(facts.metrics)), layout="constrained")
    draw_figure(fig, info, facts, final=True, smoothing=smoothing)
    return fig


class TrainingProgressPlot(LiveFigure):
    """The live training-progress view that ``train`` drives (``Plots="training-progress"``):
    inline in Jupyter, a window that updates where pyplot has a display, else a PNG rewritten
    at each validation.

    Args:
      path: the file rewritten at each validation and saved by ``close``; None:
        ``DEFAULT_PATH`` without a display, no file in Jupyter or in a window.
      max_epochs, iterations_per_epoch, validation_frequency, hardware, metrics: for the panels.
      monitor: optional ``GPUMonitor``, drawn as a panel of GPU use.
      min_interval: least seconds between redraws; smoothing: as ``training_progress``.
      stream: where the "saved to" line goes (default ``sys.stdout``).
    """

    background = True  # each update replaces ``info``: the file is drawn beside training

    def __init__(self, *, path=None, max_epochs: int | None = None,
                 iterations_per_epoch: int | None = None,
                 validation_frequency: int | None = None, hardware: str | None = None,
                 metrics=(), monitor=None, min_interval: float = 0.5, smoothing: float = 0.8,
                 stream=None):
        self.monitor, self.info, self.smoothing, self.stream = monitor, None, smoothing, stream
        self.facts = RunFacts(max_epochs, iterations_per_epoch, validation_frequency,
                              hardware, tuple(m for m in metrics if m != "accuracy"),
                              start=time.time())
        self.final, self._seen = False, (0, 0)  # validations and epochs drawn into the file
        if path is None and not (in_jupyter() or has_window()):
            path = DEFAULT_PATH
        super().__init__(figsize=(11, _figure_height(self.facts.metrics, monitor is not None)),
                         min_interval=min_interval, path=path)

    def update(self, info) -> None:
        """Take the ``TrainingInfo`` so far (fields as in ``training_progress``); cheap, and a
        file is rewritten only when a validation (or, with no validation data, an epoch) is
        new."""
        self.info = info
        seen = (_field(info, "validation_iteration").size,
                int(_field(info, "epoch").max(initial=0)))
        by_epoch = self.facts.validation_frequency is None
        milestone = seen[0] > self._seen[0] or (by_epoch and seen[1] > self._seen[1])
        self._seen = seen
        self._changed(milestone=milestone)

    def close(self, info=None) -> pathlib.Path | None:
        """Draw the final frame from ``info``, save it, stop; the file or None (warned)."""
        self.flush()
        with self._lock:
            if info is not None:
                self.info = info
            self.final, self.facts.end = True, time.time()
            self._version += 1  # the final frame differs from the last one drawn
            super().close()
            return self._save_final(self.path) if self.path is not None else None

    def _save_final(self, path: pathlib.Path) -> pathlib.Path | None:
        metadata = ({"Title": "Training progress", "Description": _summary(
            info_lines(self.info or {}, self.facts, final=True))}
            if path.suffix.lower() in ("", ".png") else None)
        if not self._write(path, metadata=metadata):
            return None
        print(f"Training progress plot saved to {path.resolve()}",
              file=self.stream or sys.stdout, flush=True)
        return path

    def _draw(self, fig) -> None:
        gpu = self.monitor.history() if self.monitor is not None else None
        gpu = gpu if gpu is not None and gpu["time"].size else None
        draw_figure(fig, self.info or {}, self.facts, final=self.final,
                    smoothing=self.smoothing, gpu=gpu)
