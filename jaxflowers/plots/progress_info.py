"""The training-progress view's information panel: what a run's record (a ``TrainingInfo`` or
mapping) and its ``RunFacts`` say, as (label, value) lines, drawn in a column each."""
from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Mapping

import numpy as np

from jaxflowers.host.clock import hms

__all__ = ["RunFacts", "complete_facts", "draw_info", "info_columns", "info_field", "info_lines",
           "summary", "validation_metrics"]


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


def info_field(info, name: str) -> np.ndarray:
    """``info.name`` (or ``info[name]``) as a 1-D array; empty where absent or None."""
    value = info.get(name) if isinstance(info, Mapping) else getattr(info, name, None)
    return np.asarray([] if value is None else value).reshape(-1)


def complete_facts(info, facts: RunFacts | None) -> RunFacts:
    """``facts`` with what is unknown there taken from ``info`` (a finished run's record)."""
    facts = dataclasses.replace(facts) if facts is not None else RunFacts()
    for name in ("max_epochs", "iterations_per_epoch"):
        value = info_field(info, name)
        if getattr(facts, name) is None and value.size:
            setattr(facts, name, int(value[0]))
    if not facts.metrics:
        facts.metrics = tuple(validation_metrics(info))
    return facts


def validation_metrics(info) -> dict:
    """``info.validation_metrics``: {name: (V,) values}, empty where absent."""
    metrics = (info.get("validation_metrics") if isinstance(info, Mapping)
               else getattr(info, "validation_metrics", None))
    return dict(metrics or {})


def _of(value, total) -> str:
    return f"{value}" if total is None else f"{value} of {total}"


def info_lines(info, facts: RunFacts, *, final: bool) -> list[tuple[str, str | None]]:
    """The information panel as (label, value) pairs; a value of None starts a section."""
    facts = complete_facts(info, facts)
    return [*_time_lines(info, facts), *_cycle_lines(info, facts),
            *_validation_lines(info, facts, final), *_other_lines(info, facts, final)]


def _time_lines(info, facts: RunFacts) -> list:
    lines: list = [("Training time", None)]
    if facts.start is not None:
        start = datetime.datetime.fromtimestamp(facts.start)
        elapsed = (facts.end if facts.end is not None else time.time()) - facts.start
        lines += [("Start time", start.strftime("%Y-%m-%d %H:%M:%S")),
                  ("Elapsed", hms(elapsed))]
    elif info_field(info, "train_time").size:  # a finished info drawn on its own
        lines.append(("Elapsed", hms(float(info_field(info, "train_time")[0]))))
    return lines


def _cycle_lines(info, facts: RunFacts) -> list:
    it, ep = info_field(info, "iteration"), info_field(info, "epoch")
    lines = [("Training cycle", None),
             ("Epoch", _of(int(ep[-1]) if ep.size else 0, facts.max_epochs)),
             ("Iteration", _of(int(it[-1]) if it.size else 0, facts.total_iterations))]
    if facts.iterations_per_epoch:
        lines.append(("Per epoch", f"{facts.iterations_per_epoch} iterations"))
    return lines


def _validation_lines(info, facts: RunFacts, final: bool) -> list:
    accuracy, loss = info_field(info, "validation_accuracy"), info_field(info, "validation_loss")
    lines: list = [("Validation", None)]
    if facts.validation_frequency:
        lines.append(("Frequency", f"every {facts.validation_frequency} iterations"))
    if accuracy.size and loss.size:
        return lines + [("Accuracy", f"{accuracy[-1]:.2f}%"), ("Loss", f"{loss[-1]:.4f}")]
    return lines + [("Accuracy", "not validated" if final else "none yet")]


def _other_lines(info, facts: RunFacts, final: bool) -> list:
    devices, lr = info_field(info, "num_devices"), info_field(info, "learn_rate")
    reason = info_field(info, "stop_reason")
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


# Inches: the panel's least width (so the panels beside it keep theirs as values change),
# the labels' indent and the gap between the widest label and the values.
_LEAST_WIDTH, _INDENT, _COLUMN_GAP = 2.9, 0.1, 0.2


def info_columns(lines, dpi: float) -> tuple[float, float]:
    """(the panel's width, its values' left side), inches, for ``lines`` drawn at ``dpi``:
    as wide as its text needs, so a long value (a hardware name) is never cut."""
    section, label, value = _text_widths(lines, dpi)
    at = _INDENT + label + _COLUMN_GAP
    return max(_LEAST_WIDTH, section, at + value) + 0.05, at


def draw_info(ax, lines, columns: tuple[float, float]) -> None:
    """The (label, value) lines into ``ax``: sections bold, labels indented, values in a
    column; ``columns``: ``info_columns``' inches for ``ax``."""
    width, at = columns
    ax.set_axis_off()
    step = 1.0 / (len(lines) + 1)
    for row, (label, value) in enumerate(lines):
        y = 1.0 - row * step
        if value is None:
            ax.text(0.0, y, label, weight="bold", va="top", fontsize="small",
                    transform=ax.transAxes)
        else:
            ax.text(_INDENT / width, y, label, va="top", fontsize="small", color="0.3",
                    transform=ax.transAxes)
            ax.text(at / width, y, value, va="top", fontsize="small", transform=ax.transAxes,
                    gid=label)


def _text_widths(lines, dpi: float) -> tuple[float, float, float]:
    """Inches of the widest section title, label and value of ``lines`` at the panel's font,
    drawn at ``dpi`` (glyphs' widths vary with the resolution)."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    renderer = RendererAgg(1, 1, dpi)

    def widest(texts, **font) -> float:
        prop = FontProperties(size="small", **font)
        return max((renderer.get_text_width_height_descent(t, prop, ismath=False)[0]
                    for t in texts), default=0.0) / dpi

    sections = [label for label, value in lines if value is None]
    pairs = [(label, value) for label, value in lines if value is not None]
    return (widest(sections, weight="bold"), widest([label for label, _ in pairs]),
            widest([value for _, value in pairs]))


def summary(lines) -> str:
    """The information panel as one line of text (the saved PNG's description)."""
    return "; ".join(f"{label}: {value}" for label, value in lines if value is not None)
