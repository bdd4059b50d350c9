"""The training-progress view (MATLAB: ``Plots="training-progress"``): ``train``'s live
``TrainingProgressPlot``, and ``training_progress`` for a finished ``info``.
"""
from __future__ import annotations

import pathlib
import sys
import time

import numpy as np

from jaxflowers.options.training import METRIC_NAMES
from jaxflowers.plots.backend import BLUE, RED, LiveFigure, has_window, in_jupyter, pyplot
from jaxflowers.plots.progress_info import (
    RunFacts,
    complete_facts,
    draw_info,
    info_columns,
    info_field,
    info_lines,
    summary,
    validation_metrics,
)

__all__ = ["DEFAULT_PATH", "TrainingProgressPlot", "draw_figure",
           "draw_panels", "epoch_spans", "percent_axis", "shade_epochs", "shade_span",
           "training_progress"]

DEFAULT_PATH = "training_progress.png"  # without a display or a path: in the working folder
_MAX_EPOCH_LABELS = 12  # more epochs than this get every k-th label


def _smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """Exponential moving average, bias-corrected like TensorBoard's; NaNs are skipped."""
    out, avg, seen = np.full(len(values), np.nan), 0.0, 0
    for i, value in enumerate(values):
        if np.isfinite(value):
            avg, seen = weight * avg + (1 - weight) * value, seen + 1
        if seen:
            out[i] = avg / (1 - weight**seen)
    return out


def epoch_spans(info, facts: RunFacts | None = None) -> list[tuple[float, float, int]]:
    """(first, last, epoch) bounds of every planned (else recorded) epoch, between iterations."""
    facts = facts or RunFacts()
    ipe = facts.iterations_per_epoch
    if ipe:
        done = int(info_field(info, "epoch").max(initial=1))
        count = max(facts.max_epochs or done, done)
        return [(k * ipe + 0.5, (k + 1) * ipe + 0.5, k + 1) for k in range(count)]
    it, ep = info_field(info, "iteration"), info_field(info, "epoch")
    if it.size == 0 or it.size != ep.size:
        return []
    starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
    ends = np.r_[it[starts[1:]] - 0.5, it[-1] + 0.5]
    return [(it[s] - 0.5, e, int(ep[s])) for s, e in zip(starts, ends)]


def shade_epochs(panels, spans) -> None:
    """Shade every other epoch of ``spans`` ((first, last, epoch) bounds) on each panel."""
    for first, last, _ in spans[1::2]:
        shade_span(panels, first, last)


def shade_span(panels, first: float, last: float) -> list:
    """Shade one epoch, from iteration ``first`` to ``last``, on each panel; the patches."""
    return [ax.axvspan(first, last, color="0.5", alpha=0.08, lw=0, gid="epoch")
            for ax in panels]


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
    it, val_it = info_field(info, "iteration"), info_field(info, "validation_iteration")
    for ax, key, ylabel, color in ((acc, "accuracy", "Accuracy (%)", BLUE),
                                   (loss, "loss", "Loss", RED)):
        y, val = info_field(info, key), info_field(info, "validation_" + key)
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
    values = np.asarray(validation_metrics(info).get(name, []), dtype=np.float64).reshape(-1)
    iterations = info_field(info, "validation_iteration")[:values.size]
    ax.plot(iterations, values[:iterations.size], "--o", ms=4, lw=1, color="black",
            label="Validation")
    ax.set(ylim=(-0.02, 1.04), ylabel=METRIC_NAMES.get(name, name))
    ax.grid(alpha=0.25)


def draw_panels(acc, loss, info, facts: RunFacts | None = None, *, smoothing: float = 0.8,
                metric_axes=()) -> None:
    """MATLAB's accuracy and loss panels (and one per metric) with epochs labelled, into the
    given Axes; the last of them gets the iteration axis."""
    facts = complete_facts(info, facts)
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


def _draw_gpu(ax, history: dict) -> None:
    for g, index in enumerate(history["device"]):
        ax.plot(history["time"], history["utilization"][:, g], lw=1, label=f"GPU {index}")
    ax.set(ylim=(0, 105), xlabel="Time (s)", ylabel="GPU use (%)")
    ax.legend(loc="lower right", fontsize="x-small", ncols=min(len(history["device"]), 4))
    ax.grid(alpha=0.25)


def draw_figure(fig, info, facts: RunFacts, *, final: bool, smoothing: float = 0.8,
                gpu: dict | None = None) -> None:
    """The whole view into ``fig``: accuracy, loss, a panel per metric (and GPU use) left, the
    information panel right, placed by fixed margins (``_panel_rects``)."""
    facts = complete_facts(info, facts)
    lines = info_lines(info, facts, final=final)
    columns = info_columns(lines, fig.dpi)
    info_width = columns[0]
    width, height = fig.get_size_inches()
    rects = _panel_rects(width, height, len(facts.metrics), bool(gpu),
                         right=info_width + _INFO_PAD + _INFO_GAP)
    acc = fig.add_axes(rects[0])
    shared = [fig.add_axes(rect, sharex=acc) for rect in rects[1:2 + len(facts.metrics)]]
    for ax in (acc, *shared[:-1]):
        ax.tick_params(labelbottom=False)
    draw_panels(acc, shared[0], info, facts, smoothing=smoothing, metric_axes=shared[1:])
    left = max(0.0, width - info_width - _INFO_PAD)
    panel = fig.add_axes([left / width, _BOTTOM / height, info_width / width,
                          (height - _TOP - _BOTTOM) / height])
    panel.set_gid("information")
    draw_info(panel, lines, columns)
    if gpu:
        _draw_gpu(fig.add_axes(rects[-1]), gpu)
    fig.suptitle("Training progress", fontsize="medium", y=1 - 0.1 / height, va="top")


# Inches. Panels: left margin (tick labels and the y label), top (the title, the epochs'
# labels), bottom (tick labels and the x label); a gap between stacked panels and a wider one
# above the GPU panel, whose neighbour has the iteration axis. Heights: a metric's and the
# GPU's panel.
_LEFT, _TOP, _BOTTOM = 0.8, 0.75, 0.55
_GAP, _GPU_GAP = 0.2, 0.6
_METRIC_HEIGHT, _GPU_HEIGHT = 1.2, 1.4
# The information panel's margin to the figure's right edge, and its gap to the panels.
_INFO_PAD, _INFO_GAP = 0.1, 0.25


def _panel_rects(width: float, height: float, metrics: int, gpu: bool, *,
                 right: float) -> list:
    """[left, bottom, width, height] in figure fractions of accuracy, loss, each metric (and
    GPU use) from the top, ``right`` inches left of the figure's right edge; by fixed margins,
    as a layout engine took a third of each redraw."""
    fixed = (_TOP + _BOTTOM + _GAP * (1 + metrics) + _METRIC_HEIGHT * metrics
             + (_GPU_GAP + _GPU_HEIGHT) * gpu)
    main = max(0.3, (height - fixed) / 2)
    heights = [main, main, *[_METRIC_HEIGHT] * metrics, *[_GPU_HEIGHT] * gpu]
    gaps = [0.0, *[_GAP] * (1 + metrics), *[_GPU_GAP] * gpu]
    rects, top = [], height - _TOP
    for gap, panel in zip(gaps, heights):
        top -= gap
        rects.append([_LEFT / width, (top - panel) / height,
                      max(0.1, width - _LEFT - right) / width, panel / height])
        top -= panel
    return rects


def _figure_height(metrics=(), gpu: bool = False) -> float:
    """Inches for ``draw_figure``'s panels: 6, and more for metrics and GPU use."""
    return 6 + (_METRIC_HEIGHT + _GAP) * len(metrics) + (_GPU_GAP + _GPU_HEIGHT) * bool(gpu)


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
    facts = complete_facts(info, None)
    fig = pyplot().figure(figsize=(11, _figure_height(facts.metrics)))
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
                         min_interval=min_interval, path=path, layout=None)

    def update(self, info) -> None:
        """Take the ``TrainingInfo`` so far (fields as in ``training_progress``); cheap, and a
        file is rewritten only when a validation (or, with no validation data, an epoch) is
        new."""
        self.info = info
        seen = (info_field(info, "validation_iteration").size,
                int(info_field(info, "epoch").max(initial=0)))
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
        metadata = ({"Title": "Training progress", "Description": summary(
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
