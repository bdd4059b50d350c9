"""An experiment's results table (MATLAB Experiment Manager's): one row per point, its
parameters, objective, final and best validation values, how it stopped, how long it ran,
where, and where its network and metrics are kept; sorted by the objective.

Rows come from the study's trials, so the table reads the same from a running experiment,
a finished one or one whose caller died. A point run several times (a rerun after a crash
or a failure) shows its finished attempt, else its latest. Imports pandas when a table is
made, and neither Optuna nor JAX.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Iterable, Mapping, Sequence, TextIO

from jaxflowers.plots.backend import in_jupyter

__all__ = ["LiveTable", "format_value", "frame", "rows", "trial_line"]

# Columns after the parameters, in order; "objective" is the value the search compares
# (the final value of a finished trial, the last one reported by a pruned trial).
COLUMNS = ("objective", "final_validation_accuracy", "final_validation_loss",
           "best_validation_accuracy", "best_validation_loss", "stop_reason",
           "pruned_at_iteration", "iterations", "epochs", "wall_time", "compile_time",
           "train_time", "num_devices", "where",
           "network", "metrics", "log", "error", "attempts")
_FINISHED = ("complete", "pruned")
_INTEGERS = ("trial", "pruned_at_iteration", "iterations", "epochs", "num_devices", "attempts",
             "point")


def rows(trials: Iterable, names: Sequence[str]) -> list[dict]:
    """One row per point from Optuna ``FrozenTrial``s (``names``: the parameters)."""
    by_point: dict[Any, list[dict]] = {}
    for trial in trials:
        if "duplicate_of" in trial.user_attrs:  # asked for a point another caller had
            continue
        row = _row(trial, names)
        by_point.setdefault(row["point"], []).append(row)
    chosen = []
    for attempts in by_point.values():
        finished = [r for r in attempts if r["state"] in _FINISHED]
        row = max(finished or attempts, key=lambda r: r["trial"])
        chosen.append({**row, "attempts": len(attempts)})
    return chosen


def frame(table_rows: Sequence[Mapping], names: Sequence[str], direction: str):
    """The rows as a pandas ``DataFrame`` sorted best first (trials without a value last)."""
    import pandas

    columns = ["trial", "state", *names, *(c for c in COLUMNS if c not in names), "point"]
    table = pandas.DataFrame(list(table_rows), columns=columns)
    table = table.astype({name: "Int64" for name in _INTEGERS})  # integers, missing or not
    table = table.sort_values(["objective", "trial"], ascending=[direction == "minimize", True],
                              na_position="last", kind="stable")
    return table.reset_index(drop=True)


def _row(trial, names: Sequence[str]) -> dict:
    attrs = trial.user_attrs
    state = trial.state.name.lower().replace("fail", "failed")
    wall = None
    if trial.datetime_start is not None and trial.datetime_complete is not None:
        wall = (trial.datetime_complete - trial.datetime_start).total_seconds()
    row = {"trial": trial.number, "state": state, "point": attrs.get("point"),
           "objective": trial.value, "wall_time": wall,
           **{column: attrs.get(column) for column in COLUMNS[1:] if column in attrs},
           **{name: trial.params.get(name) for name in names}}
    if state == "failed" and not row.get("error"):
        row["error"] = "its caller stopped before it ended"
    return row


def format_value(name: str, value) -> str:
    """An objective or metric for people: accuracies in %, others with 4 digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.2f}%" if name.endswith("accuracy") else f"{value:.4g}"


def trial_line(row: Mapping, names: Sequence[str], objective: str, rank: str = "") -> str:
    """One line saying how a trial ended, e.g. "Trial 3 complete: validation_accuracy
    84.21% | depth=2 initial_learn_rate=0.0123 | 41.2 s on GPU 1 | rank 1 of 4"."""
    state = row["state"]
    if state == "pruned":
        state = f"pruned at iteration {row.get('pruned_at_iteration')}"
    head = f"Trial {row['trial']} {state}"
    if row["state"] == "failed":
        head += f": {row.get('error') or 'failed'}"
    else:
        head += f": {objective} {format_value(objective, row.get('objective'))}"
    import pandas

    settings = " ".join(f"{n}={_short(row.get(n))}" for n in names)
    wall, place = row.get("wall_time"), row.get("where")
    where = "" if pandas.isna(wall) else f"{wall:.1f} s"
    if isinstance(place, str):
        where += f" on {place}"
    return " | ".join(part for part in (head, settings, where.strip(), rank) if part)


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class LiveTable:
    """The results table as trials end: in Jupyter one table updated in place, elsewhere one
    line per trial with its rank.

    Args:
      names: the parameters.
      objective: the objective's name.
      stream: where lines are printed outside Jupyter (default ``sys.stdout``).
    """

    def __init__(self, names: Sequence[str], objective: str, stream: TextIO | None = None):
        self.names, self.objective = list(names), objective
        self.stream, self._jupyter, self._handle = stream or sys.stdout, in_jupyter(), None

    def update(self, table, trial_number: int) -> None:
        """Show ``table`` (a ``frame``) after trial ``trial_number`` ended."""
        if self._jupyter:
            self._show(table)
            return
        position = table.index[table["trial"] == trial_number]
        if not len(position):
            return
        row = table.loc[position[0]].to_dict()
        valued = int(table["objective"].notna().sum())
        ranked = row["state"] != "failed" and valued
        rank = f"rank {position[0] + 1} of {valued}" if ranked else ""
        print(trial_line(row, self.names, self.objective, rank), file=self.stream, flush=True)

    def _show(self, table) -> None:
        from IPython.display import display

        shown = table[["trial", "state", *self.names, "objective", "stop_reason", "wall_time",
                       "where"]]
        if self._handle is None:
            self._handle = display(shown, display_id=True)
        else:
            self._handle.update(shown)
