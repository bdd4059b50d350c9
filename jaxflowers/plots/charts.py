"""Charts: confusion chart and speedup, and the progress views' public names.

Static charts use pyplot (``figures.pyplot``, imported only inside the functions that
draw), so Jupyter shows them at the end of the cell; outside Jupyter pyplot gets the
non-interactive Agg backend, so nothing ever opens a window. The training-progress view
(``jaxflowers.plots.training_progress``) and the sweep grid (``jaxflowers.plots.sweep_grid``) are reachable here.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from jaxflowers.inference.labels import confusion_matrix
from jaxflowers.plots.backend import BLUE, RED, pyplot
from jaxflowers.plots.sweep_grid import SweepProgressPlot, sweep_progress
from jaxflowers.plots.training_progress import TrainingProgressPlot, training_progress

__all__ = ["ConfusionChart", "SweepProgressPlot", "TrainingProgressPlot", "confusion_chart",
           "speedup", "speedup_table", "sweep_progress", "training_progress"]

_DIVISOR = {"row-normalized": 1, "column-normalized": 0}


def _percent(part: np.ndarray, whole) -> np.ndarray:
    """100 * part / whole as float64; NaN where whole is 0 (a class with no samples)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100.0 * part / np.asarray(whole, dtype=np.float64)


def _normalize(counts: np.ndarray, mode: str) -> np.ndarray:
    """The cell values for a MATLAB ``Normalization`` mode."""
    if mode == "absolute":
        return counts.astype(np.float64)
    if mode == "total-normalized":
        return _percent(counts, counts.sum())
    return _percent(counts, counts.sum(axis=_DIVISOR[mode], keepdims=True))


def _draw_cells(ax, values, diagonal, percent: bool, blank_zero: bool = True) -> None:
    """Colour cells (blue where correct, red where not, stronger for larger) and label them;
    zero cells stay blank and unlabelled like MATLAB's, unless ``blank_zero`` is False."""
    v = np.nan_to_num(values)
    scale = v / max(v.max(), 1e-12)
    rgb = 1.0 - scale[..., None] * (1.0 - np.where(diagonal[..., None], BLUE, RED))
    ax.imshow(rgb, aspect="auto", interpolation="nearest")
    size = float(np.clip(12 - 0.4 * max(values.shape), 5, 10))
    for (i, j), value in np.ndenumerate(values):
        if np.isfinite(value) and (value != 0 or not blank_zero):
            text = f"{value:.1f}%" if percent else f"{value:g}"
            ax.text(j, i, text, ha="center", va="center", fontsize=size,
                    color="white" if scale[i, j] > 0.55 else "black")


@dataclass
class ConfusionChart:
    """What ``confusion_chart`` drew (MATLAB: ``ConfusionMatrixChart``).

    Attributes:
      figure, ax: the matplotlib Figure and the Axes holding the cells.
      matrix: (K, K) int64 counts; rows are true classes, columns predicted classes.
      normalized_values: (K, K) float64, what the cells show (``NormalizedValues``).
      row_summary: (K, 2) float64 [correct, incorrect] per true class, or None.
      column_summary: (2, K) float64 [correct; incorrect] per predicted class, or None.
      class_names: list[str] of the K classes.
    """

    figure: object
    ax: object
    matrix: np.ndarray
    normalized_values: np.ndarray
    row_summary: np.ndarray | None
    column_summary: np.ndarray | None
    class_names: list

    def __repr__(self) -> str:
        return f"ConfusionChart({len(self.class_names)} classes, {self.matrix.sum()} samples)"

    def savefig(self, path, **savefig_kwargs):
        """Write the chart to ``path`` (PNG, PDF, SVG, ... by extension), as
        ``Figure.savefig`` (MATLAB: ``saveas``/``exportgraphics``); returns ``path``."""
        self.figure.savefig(path, **savefig_kwargs)
        return path


_MODES = ("off", "absolute", "row-normalized", "column-normalized", "total-normalized")


def _check_mode(name: str, value, allowed: tuple) -> str | None:
    value = "off" if value is None else value
    if value not in allowed:
        raise ValueError(f"confusion_chart({name}={value!r}) must be one of {allowed}")
    return None if value == "off" else value


def confusion_chart(true_labels, pred_labels, class_names, *, row_summary="row-normalized",
                    column_summary="column-normalized", title=None, ax=None,
                    normalization="absolute") -> ConfusionChart:
    """Draw a confusion matrix with per-class summaries (MATLAB: ``confusionchart``).

    Args:
      true_labels, pred_labels: (N,) int class indices into ``class_names``, or (N,)
        strings equal to class names.
      class_names: the K class names, in index order.
      row_summary: "row-normalized" (% correct / incorrect of each true class, i.e. recall),
        "absolute", "total-normalized", or None / "off" to hide.
      column_summary: "column-normalized" (% correct / incorrect of each predicted class,
        i.e. precision), "absolute", "total-normalized", or None / "off".
      title: the chart's title; None: the sample count and the share correct; "": none.
      ax: Axes to draw the cells into; summaries are appended beside it. None makes a figure.
      normalization: what the cells show: "absolute" counts, "row-normalized",
        "column-normalized" or "total-normalized" percentages.

    Returns:
      A ``ConfusionChart`` with ``.figure``, ``.matrix`` (counts) and the summaries.
    """
    names = [str(c) for c in class_names]
    k, counts = len(names), confusion_matrix(true_labels, pred_labels, names,
                                              caller="confusion_chart")
    normalization = _check_mode("normalization", normalization, _MODES[1:])
    rows = _check_mode("row_summary", row_summary, _MODES[:3] + _MODES[4:])
    cols = _check_mode("column_summary", column_summary, _MODES[:2] + _MODES[3:])
    if ax is None:
        cell = float(np.clip(8 / k, 0.3, 0.8))  # inches
        size = (2.5 + cell * (k + 2.2 * bool(rows)), 2.5 + cell * (k + 2.2 * bool(cols)))
        ax = pyplot().figure(figsize=size, layout="tight").gca()
    values = _normalize(counts, normalization)
    _draw_cells(ax, values, np.eye(k, dtype=bool), normalization != "absolute")
    ax.set(xticks=range(k), yticks=range(k), xlabel="Predicted Class", ylabel="True Class")
    ax.set_xticklabels(names, rotation=90 if max(map(len, names), default=0) > 4 else 0)
    ax.set_yticklabels(names)
    if title is None:
        total = int(counts.sum())
        title = f"{total} samples, {_percent(np.trace(counts), total):.1f}% correct"
    if title:
        ax.set_title(title)
    if rows or cols:
        from mpl_toolkits.axes_grid1 import make_axes_locatable

        divider = make_axes_locatable(ax)
    row_vals = _summaries(divider, ax, counts, rows, axis=1) if rows else None
    col_vals = _summaries(divider, ax, counts, cols, axis=0) if cols else None
    return ConfusionChart(ax.figure, ax, counts, values, row_vals, col_vals, names)


def _summaries(divider, ax, counts, mode, axis: int):
    """[correct, incorrect] per class along ``axis`` (1: true rows, 0: predicted columns),
    drawn in an Axes appended right of (axis=1) or below (axis=0) the cells."""
    correct = np.diag(counts)
    both = np.stack([correct, counts.sum(axis=axis) - correct], axis=axis)  # (K,2)|(2,K)
    whole = counts.sum() if mode == "total-normalized" else counts.sum(axis, keepdims=True)
    values = both.astype(np.float64) if mode == "absolute" else _percent(both, whole)
    side, share, pad = ("right", "sharey", 0.15) if axis == 1 else ("bottom", "sharex", 0.75)
    if axis == 0:  # leave room for the predicted-class names and label under the cells
        pad += 0.1 + 0.07 * max(len(t.get_text()) for t in ax.get_xticklabels())
    extra = divider.append_axes(side, size=f"{200 / len(correct):.0f}%", pad=pad,
                                **{share: ax})
    is_correct = np.stack([np.ones(len(correct)), np.zeros(len(correct))], axis=axis)
    _draw_cells(extra, values, is_correct.astype(bool), mode != "absolute", blank_zero=False)
    _header(extra, axis)
    return values


def _header(strip, axis: int) -> None:
    """Name a summary strip and its two rows (below the cells) or columns (beside them)."""
    strip.spines[:].set_visible(False)
    strip.tick_params(left=False, bottom=False, labelleft=False, labelbottom=False)
    if axis == 1:
        strip.set_xticks([0, 1], ["Correct", "Incorrect"], fontsize="small")
        strip.tick_params(labeltop=True, top=False)
    else:
        strip.set_yticks([0, 1], ["Correct", "Incorrect"], fontsize="small")
        strip.tick_params(labelleft=True)
    strip.set_title("Per true class" if axis == 1 else "Per predicted class",
                    fontsize="small")


_KEYS = ("model", "strategy", "scaling", "devices", "images_per_s")


def _records(results) -> list[Mapping]:
    records = results.get("results", results.get("records")) if isinstance(
        results, Mapping) else results
    if records is None:
        raise ValueError("speedup: expected a list of records or a dict with 'results'")
    for record in records:
        missing = [k for k in _KEYS if k not in record]
        if missing:
            raise ValueError(f"speedup: record {dict(record)!r} lacks {missing}")
    return list(records)


def speedup_table(results) -> list[dict]:
    """Speedup and efficiency of each benchmark record over its smallest device count.

    Args:
      results: bench JSON (a dict with "results") or a list of records, each with
        ``model``, ``strategy`` (str), ``scaling`` ("weak" or "strong"), ``devices`` (int)
        and ``images_per_s`` (float). Repeats of one configuration are reduced to their median.

    Returns:
      list of dicts (model, strategy, scaling, devices, images_per_s, speedup, efficiency)
      sorted by model, strategy, scaling, devices. ``speedup`` = images/s at N devices over
      images/s at 1 device of the same model/strategy/scaling (if the smallest count n0 > 1,
      ``n0 * ips_N / ips_n0``); ``efficiency`` = speedup / devices.
    """
    groups: dict[tuple, dict[int, list[float]]] = {}
    for r in _records(results):
        key = (str(r["model"]), str(r["strategy"]), str(r["scaling"]))
        groups.setdefault(key, {}).setdefault(int(r["devices"]), []).append(
            float(r["images_per_s"]))
    rows = []
    for key in sorted(groups):
        ips = {n: float(np.median(v)) for n, v in sorted(groups[key].items())}
        n0 = min(ips)
        for n, value in ips.items():
            gain = n0 * value / ips[n0]
            rows.append(dict(zip(("model", "strategy", "scaling"), key), devices=n,
                             images_per_s=value, speedup=gain, efficiency=gain / n))
    return rows


def speedup(results, *, ax=None, path=None):
    """Plot images/s and speedup against device count, one line per system.

    Args:
      results: as for ``speedup_table``; a bench JSON's ``environment["devices"]`` (the
        devices in words) becomes the figure's title.
      ax: a pair of Axes (images/s, speedup) to draw into; None makes a figure.
      path: if given, the figure is also saved there (PNG by default).

    Returns:
      The matplotlib Figure: left, images/s at each device count with the values written
      beside the points (useful with one device too); right, the speedup over the fewest
      devices with the ideal y = x line dotted, or a note when only one count was measured.
    """
    rows = speedup_table(results)
    if ax is None:
        _, ax = pyplot().subplots(1, 2, figsize=(11, 4.5), layout="constrained")
    ips_ax, gain_ax = ax
    counts = sorted({r["devices"] for r in rows})
    systems = {}  # label -> that system's rows, by device count
    for r in rows:
        systems.setdefault(f"{r['model']}, {r['strategy']} ({r['scaling']})", []).append(r)
    if len(counts) > 1:
        _throughput_lines(ips_ax, systems, counts)
    else:
        _throughput_bars(ips_ax, systems, counts)
    _speedup_panel(gain_ax, systems, counts, ips_ax.lines)
    for panel in ax:
        panel.grid(alpha=0.25)
        if panel.lines:
            panel.legend(fontsize="small")
    environment = results.get("environment", {}) if isinstance(results, Mapping) else {}
    if environment.get("devices"):
        ips_ax.figure.suptitle(environment["devices"], fontsize="medium")
    if path is not None:
        ips_ax.figure.savefig(path, dpi=120)
    return ips_ax.figure


def _throughput_lines(ax, systems: dict, counts: list[int]) -> None:
    """Images/s against device count, one line per system, each value written beside it."""
    for label, group in systems.items():
        style = "-o" if group[0]["scaling"] == "strong" else "--s"
        (line,) = ax.plot([r["devices"] for r in group], [r["images_per_s"] for r in group],
                          style, label=label)
        for r in group:
            ax.annotate(f"{r['images_per_s']:,.0f}", (r["devices"], r["images_per_s"]),
                        xytext=(5, -10), textcoords="offset points", fontsize="x-small",
                        color=line.get_color())
    ax.set(xlabel="Devices", ylabel="Images/s", title="Throughput", xticks=counts)
    ax.set_ylim(0, 1.1 * ax.get_ylim()[1])


def _throughput_bars(ax, systems: dict, counts: list[int]) -> None:
    """With one device count: one bar of images/s per system, its value at its end."""
    labels = list(systems)
    values = [systems[label][0]["images_per_s"] for label in labels]
    bars = ax.barh(labels, values, color=[f"C{i}" for i in range(len(labels))])
    ax.bar_label(bars, [f"{v:,.0f}" for v in values], padding=3, fontsize="small")
    ax.invert_yaxis()  # first system on top
    ax.set_xlim(0, 1.2 * max(values, default=1))
    ax.set(xlabel=f"Images/s on {counts[0] if counts else 0} device(s)", title="Throughput")


def _speedup_panel(ax, systems: dict, counts: list[int], styles) -> None:
    """Each system's speedup in the style of its throughput line, the ideal line and
    integer ticks; with fewer than two device counts, a note instead."""
    ax.set_title("Speedup")
    if len(counts) < 2:
        ax.text(0.5, 0.5, f"Measured on {counts[0] if counts else 0} device(s) only:\n"
                "a speedup needs two or more device counts\n"
                "(python -m jaxflowers.bench --devices 1 2 ...)", ha="center", va="center",
                fontsize="small", transform=ax.transAxes)
        ax.set(xticks=[], yticks=[])
        return
    from matplotlib.ticker import MaxNLocator

    for (label, group), style in zip(systems.items(), styles):
        ax.plot([r["devices"] for r in group], [r["speedup"] for r in group],
                style.get_linestyle(), marker=style.get_marker(), label=label,
                color=style.get_color())
    ax.plot([counts[0], counts[-1]], [counts[0], counts[-1]], ":", color="0.4", label="ideal")
    ax.set(xlabel="Devices", ylabel="Speedup over 1 device", xticks=counts)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
