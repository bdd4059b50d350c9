"""MATLAB's ``confusionchart``: counts or percentages per cell, per-class summaries."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxflowers.inference.labels import confusion_matrix
from jaxflowers.plots.backend import BLUE, RED, pyplot, shown

__all__ = ["ConfusionChart", "confusion_chart"]

_DIVISOR = {"row-normalized": 1, "column-normalized": 0}


def _percent(part: np.ndarray, whole) -> np.ndarray:
    """100 * part / whole as float64; NaN where whole is 0 (a class with no samples)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100.0 * part / np.asarray(whole, dtype=np.float64)


def _normalize(counts: np.ndarray, mode: str) -> np.ndarray:
    if mode == "absolute":
        return counts.astype(np.float64)
    if mode == "total-normalized":
        return _percent(counts, counts.sum())
    return _percent(counts, counts.sum(axis=_DIVISOR[mode], keepdims=True))


def _draw_cells(ax, values, diagonal, percent: bool, size: float,
                blank_zero: bool = True) -> None:
    """Colour and label cells (blue correct, red not) in ``size`` points; zero cells blank if
    ``blank_zero``."""
    v = np.nan_to_num(values)
    scale = v / max(v.max(), 1e-12)
    rgb = 1.0 - scale[..., None] * (1.0 - np.where(diagonal[..., None], BLUE, RED))
    ax.imshow(rgb, aspect="auto", interpolation="nearest")
    for (i, j), value in np.ndenumerate(values):
        if np.isfinite(value) and (value != 0 or not blank_zero):
            text = f"{value:.1f}%" if percent else f"{value:g}"
            # inside its cell: no part of the layout (tight layout skips measuring it)
            ax.text(j, i, text, ha="center", va="center", fontsize=size,
                    color="white" if scale[i, j] > 0.55 else "black", in_layout=False)


@dataclass
class ConfusionChart:
    """What ``confusion_chart`` drew (MATLAB: ``ConfusionMatrixChart``).

    Attributes:
      figure, ax: the Figure and the cells' Axes. matrix: (K, K) int64 counts, rows true.
      normalized_values: (K, K) float64 cell values; row_summary (K, 2), column_summary (2, K)
        float64 [correct, incorrect] or None; class_names: the K names.
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
        """Write the chart to ``path``, format by extension (MATLAB: ``exportgraphics``)."""
        # Laid out once, then drawn once: with its layout engine on, ``savefig`` would walk
        # every cell's text twice (a layout pass, then the drawing).
        engine = self.figure.get_layout_engine()
        if engine is None:
            self.figure.savefig(path, **savefig_kwargs)
            return path
        import matplotlib

        figure, dpi = self.figure, savefig_kwargs.get("dpi", matplotlib.rcParams["savefig.dpi"])
        shown_dpi = figure.dpi
        try:
            figure.dpi = shown_dpi if dpi in (None, "figure") else dpi  # as savefig lays out
            engine.execute(figure)
        finally:
            figure.dpi = shown_dpi
        figure.set_layout_engine(None)
        try:
            figure.savefig(path, **savefig_kwargs)
        finally:
            figure.set_layout_engine(engine)
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
    """Draw a confusion matrix with summaries: a ``ConfusionChart`` (MATLAB's ``confusionchart``).

    Args:
      true_labels, pred_labels: (N,) int indices into ``class_names``, or (N,) class names.
      class_names: the K class names, in index order.
      row_summary, column_summary: "row-normalized" (recall) / "column-normalized" (precision),
        "absolute", "total-normalized", or None/"off".
      title: None: the sample count and share correct; "": none.
      ax: Axes for the cells (summaries appended beside); None makes a figure.
      normalization: "absolute" counts, or "row-", "column-", "total-normalized" percent.
    """
    names = [str(c) for c in class_names]
    k, counts = len(names), confusion_matrix(true_labels, pred_labels, names,
                                              caller="confusion_chart")
    labels = [shown(name) for name in names]
    normalization = _check_mode("normalization", normalization, _MODES[1:])
    rows = _check_mode("row_summary", row_summary, _MODES[:3] + _MODES[4:])
    cols = _check_mode("column_summary", column_summary, _MODES[:2] + _MODES[3:])
    longest = max(map(len, labels), default=0)
    if ax is None:
        cell = float(np.clip(6 / k, 0.35, 0.9))  # inches: a few classes large, many small
        room = 0.09 * min(longest, 30)  # for the class names beside and under the cells
        size = (1.3 + room + cell * k + max(2.2 * cell, 1.45) * bool(rows),
                1.5 + room * (longest > 4) + cell * (k + 2.2 * bool(cols)))
        ax = pyplot().figure(figsize=size, layout="tight").gca()
    width, height = ax.get_position().size * ax.figure.get_size_inches()
    cell = min((width - 1.45 * bool(rows)) / k, height / (k + 2.2 * bool(cols)))
    font = float(np.clip(cell * 72 / 4.5, 6, 11))  # "100.0%" fits its cell
    values = _normalize(counts, normalization)
    _draw_cells(ax, values, np.eye(k, dtype=bool), normalization != "absolute", font)
    ax.set(xticks=range(k), yticks=range(k), xlabel="Predicted Class", ylabel="True Class")
    ax.set_xticklabels(labels, rotation=90 if longest > 4 else 0)
    ax.set_yticklabels(labels)
    if title is None:
        total = int(counts.sum())
        title = f"{total} samples, {_percent(np.trace(counts), total):.1f}% correct"
    if title:
        ax.set_title(shown(title))
    if rows or cols:
        from mpl_toolkits.axes_grid1 import make_axes_locatable

        divider = make_axes_locatable(ax)
    row_vals = _summaries(divider, ax, counts, rows, axis=1, font=font) if rows else None
    col_vals = _summaries(divider, ax, counts, cols, axis=0, font=font) if cols else None
    return ConfusionChart(ax.figure, ax, counts, values, row_vals, col_vals, names)


def _summaries(divider, ax, counts, mode, axis: int, font: float):
    """Draw [correct, incorrect] per true row (axis=1, right) or predicted column (0, below)."""
    correct = np.diag(counts)
    both = np.stack([correct, counts.sum(axis=axis) - correct], axis=axis)  # (K,2)|(2,K)
    whole = counts.sum() if mode == "total-normalized" else counts.sum(axis, keepdims=True)
    values = both.astype(np.float64) if mode == "absolute" else _percent(both, whole)
    side, share, pad = ("right", "sharey", 0.15) if axis == 1 else ("bottom", "sharex", 0.72)
    if axis == 0:  # leave room for the predicted-class names and label under the cells
        longest = max(len(t.get_text()) for t in ax.get_xticklabels())
        pad += 0.075 * min(longest, 30) if longest > 4 else 0.0
    share_of_cells = 200 / len(correct)  # two cells' width, room for "Correct Incorrect"
    if axis == 1:
        share_of_cells = max(share_of_cells, 100 * 1.3 / ax.get_position().width
                             / ax.figure.get_size_inches()[0])
    extra = divider.append_axes(side, size=f"{share_of_cells:.0f}%", pad=pad,
                                **{share: ax})
    is_correct = np.stack([np.ones(len(correct)), np.zeros(len(correct))], axis=axis)
    _draw_cells(extra, values, is_correct.astype(bool), mode != "absolute", font,
                blank_zero=False)
    _header(extra, axis)
    return values


def _header(strip, axis: int) -> None:
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
