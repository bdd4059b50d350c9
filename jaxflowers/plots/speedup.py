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
        systems.setdefault(_label(r), []).append(r)
    if len(counts) > 1:
        _throughput_lines(ips_ax, systems, counts)
        _speedup_panel(gain_ax, systems, counts, ips_ax.lines)
    else:  # no speedup to draw: how steady each timed window was instead
        raw = {label: [r for r in _records(results) if _label(r) == label]
               for label in systems}
        _throughput_bars(ips_ax, systems, counts, raw)
        _windows_panel(gain_ax, raw)
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


def _label(record) -> str:
    return f"{record['model']}, {record['strategy']} ({record['scaling']})"


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


def _throughput_bars(ax, systems: dict, counts: list[int], raw: dict) -> None:
    """One bar per system (the median window) with each timed window as a dot."""
    labels = list(systems)
    values = [systems[label][0]["images_per_s"] for label in labels]
    bars = ax.barh(labels, values, height=0.5, color=[f"C{i}" for i in range(len(labels))])
    ax.bar_label(bars, [f"{v:,.0f}" for v in values], label_type="center", color="white",
                 fontsize="small")  # inside: the dots may pass the bar's end
    for y, label in enumerate(labels):
        for record in raw[label]:
            if record.get("windows_s") and record.get("global_batch"):
                each = [record["window_steps"] * record["global_batch"] / w
                        for w in record["windows_s"]]
                ax.plot(each, [y] * len(each), "o", ms=4, mfc="white", mec="black",
                        label="each timed window" if y == 0 else None)
    ax.set_ylim(len(labels) - 0.4, -0.6)  # first system on top, bars not stretched
    ax.set_xlim(0, 1.2 * max([v for v in values] + [x for line in ax.lines
                                                    for x in line.get_xdata()], default=1))
    count = counts[0] if counts else 0
    ax.set(xlabel=f"Images/s on {count} device{'s' if count != 1 else ''} (bar: median window)",
           title="Throughput")


def _windows_panel(ax, systems: dict) -> None:
    """Milliseconds per iteration in each timed window of each system (its bench records
    with ``windows_s`` and ``window_steps``), and why there is no speedup."""
    from matplotlib.ticker import MaxNLocator

    for i, (label, records) in enumerate(systems.items()):
        record = records[0] if records else {}
        windows, steps = record.get("windows_s"), record.get("window_steps")
        if windows and steps:
            ms = [1e3 * w / steps for w in windows]
            compile_s = record.get("compile_s")
            more = f", compile {compile_s:.1f} s" if compile_s is not None else ""
            ax.plot(range(1, len(ms) + 1), ms, "-o", ms=4, color=f"C{i}",
                    label=f"{label}{more}")
    ax.set(title="Time per iteration, window by window", xlabel="Timed window",
           ylabel="ms per iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.lines:
        ax.set_ylim(0, 1.25 * max(max(line.get_ydata()) for line in ax.lines))
    ax.text(0.5, 0.03, "one device count: no speedup (bench --devices 1 2 ... draws it)",
            ha="center", va="bottom", fontsize="small", color="0.35", transform=ax.transAxes)


def _speedup_panel(ax, systems: dict, counts: list[int], styles) -> None:
    """Each system's speedup against the device count, and the ideal line."""
    ax.set_title("Speedup")
    from matplotlib.ticker import MaxNLocator

    for (label, group), style in zip(systems.items(), styles):
        ax.plot([r["devices"] for r in group], [r["speedup"] for r in group],
                style.get_linestyle(), marker=style.get_marker(), label=label,
                color=style.get_color())
    ax.plot([counts[0], counts[-1]], [counts[0], counts[-1]], ":", color="0.4", label="ideal")
    ax.set(xlabel="Devices", ylabel="Speedup over 1 device", xticks=counts)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
