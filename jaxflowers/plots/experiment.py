"""An experiment's parameters against its objective: one scatter panel per parameter
(Experiment Manager's and Optuna's slice plot), the best trial marked."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxflowers.plots.backend import BLUE, RED, pyplot

__all__ = ["parameter_chart"]

_STATE_STYLE = {"complete": dict(color=BLUE, marker="o", label="complete"),
                "pruned": dict(color="0.55", marker="x", label="pruned")}


def parameter_chart(table, parameters: Sequence[str], objective: str = "objective", *,
                    direction: str = "maximize", log: Sequence[str] = (), label: str | None = None,
                    title: str | None = None, figure=None):
    """Scatter the objective of every trial against each parameter.

    Args:
      table: an experiment's results table (a pandas ``DataFrame`` with a "state" column,
        one column per parameter and ``objective``).
      parameters: the columns to draw, one panel each.
      objective: the column on the y axis (its name labels the axis).
      direction: "maximize" or "minimize": which trial is the best, marked with a red star.
      log: parameters drawn on a log scale (learning rates, L2 factors).
      label: the y axis's label (default ``objective``).
      title: the figure's title.
      figure: a matplotlib ``Figure`` to draw into; None makes one with pyplot.

    Returns:
      The ``Figure``. Trials that failed (no objective) are left out; pruned trials are
      drawn at the last value they reported.
    """
    if not parameters:
        raise ValueError("parameter_chart: name at least one parameter")
    ncols = min(3, len(parameters))
    nrows = math.ceil(len(parameters) / ncols)
    if figure is None:
        figure = pyplot().figure(figsize=(4.2 * ncols, 3.4 * nrows), layout="constrained")
    else:
        figure.set_size_inches(4.2 * ncols, 3.4 * nrows)
        figure.set_layout_engine("constrained")
    axes = np.atleast_1d(figure.subplots(nrows, ncols, squeeze=False)).ravel()
    valued = table[table[objective].notna()]
    best = _best(valued, objective, direction)
    for ax, name in zip(axes, parameters):
        _panel(ax, valued, name, objective, best, log=name in log)
        ax.set_ylabel(label or objective)
    for ax in axes[len(parameters):]:
        ax.set_axis_off()
    if len(valued):
        axes[0].legend(loc="best", fontsize="x-small")
    figure.suptitle(title or f"{label or objective} of {len(valued)} trials")
    return figure


def _best(valued, objective: str, direction: str):
    if not len(valued):
        return None
    finished = valued[valued["state"] == "complete"]
    pool = finished if len(finished) else valued
    return pool.loc[pool[objective].idxmax() if direction == "maximize"
                    else pool[objective].idxmin()]


def _panel(ax, valued, name: str, objective: str, best, *, log: bool) -> None:
    values = valued[name]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    categories = [] if numeric else sorted({str(v) for v in values})
    position = (lambda v: v) if numeric else (lambda v: categories.index(str(v)))
    for state, style in _STATE_STYLE.items():
        rows = valued[valued["state"] == state]
        if len(rows):
            ax.scatter([position(v) for v in rows[name]], rows[objective], s=28, alpha=0.8,
                       **style)
    if best is not None:
        ax.scatter([position(best[name])], [best[objective]], s=140, marker="*", color=RED,
                   zorder=3, label=f"best (trial {int(best['trial'])})")
    if log and numeric:
        ax.set_xscale("log")
    integers = sorted({int(v) for v in values}) if numeric and all(
        float(v).is_integer() for v in values) else []
    if categories or 0 < len(integers) <= 12:
        ticks = categories or integers
        ax.set_xticks(range(len(ticks)) if categories else ticks, [str(t) for t in ticks])
    ax.set(xlabel=name)
    ax.grid(alpha=0.25)
