"""The bench's figure: images/s and speedup against the device count (``speedup``)."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from jaxflowers.plots.backend import pyplot

__all__ = ["speedup", "speedup_table"]

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
    """Speedup and efficiency of each benchmark record over its smallest device count n0.

    Args:
      results: bench JSON or a list of records (model, strategy, scaling, devices, images_per_s).

    Returns:
      Sorted dicts with images_per_s (median of repeats), speedup = n0 * ips_N / ips_n0 and
      efficiency = speedup / N.
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
    """A Figure of images/s and speedup (with the ideal line) against device count.

    Args:
      results: as for ``speedup_table``; ``environment["devices"]`` becomes the title.
      ax: a pair of Axes to draw into; None makes a figure. path: also save the figure there.
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
    labels = list(systems)
    values = [systems[label][0]["images_per_s"] for label in labels]
    bars = ax.barh(labels, values, color=[f"C{i}" for i in range(len(labels))])
    ax.bar_label(bars, [f"{v:,.0f}" for v in values], padding=3, fontsize="small")
    ax.invert_yaxis()  # first system on top
    ax.set_xlim(0, 1.2 * max(values, default=1))
    ax.set(xlabel=f"Images/s on {counts[0] if counts else 0} device(s)", title="Throughput")


def _speedup_panel(ax, systems: dict, counts: list[int], styles) -> None:
    """Each system's speedup and the ideal line; a note with fewer than two device counts."""
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
