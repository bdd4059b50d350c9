"""What the parfeval example prints and keeps: the live table, the summary and its files,
written before any figure (a figure that cannot be saved costs only itself)."""
from __future__ import annotations

import dataclasses
import pathlib
import sys
import time
from typing import Any, Mapping, Sequence, TextIO

from jaxflowers.host.files import write_json_atomic

__all__ = ["JobOutcome", "ProgressTable", "print_outcomes", "save_figure", "summary",
           "write_metrics", "write_results"]

# Job, depth, epoch, iteration, accuracies, seconds since the start, then free text (what
# happened to the job), so a start, an end or an error never shifts the columns.
_ROW = "{:>4} {:>6} {:>6} {:>10} {:>11} {:>11} {:>9}  {}"


@dataclasses.dataclass(frozen=True)
class JobOutcome:
    """How one job of the sweep ended."""

    index: int  # the job's number in the pool
    depth: int  # its cifar_net depth
    info: Any = None  # its TrainingInfo, when it returned one (a diverged run too)
    error: str | None = None  # "cancelled", the first line of its error, or why it diverged

    @property
    def status(self) -> str:
        """"done", "cancelled" or "failed" (a diverged run has failed)."""
        return "done" if self.error is None else \
            "cancelled" if self.error == "cancelled" else "failed"

    @property
    def accuracy(self) -> float | None:
        """The final validation accuracy (%) of a job that is done, else None."""
        return None if self.error is not None else self.info.final_validation_accuracy


class ProgressTable:
    """An ``after_each`` callback printing a row per validation and per job start and end, in
    the same columns; ``began``/``ended`` hold those times (s since ``start``) by job index."""

    def __init__(self, depths: Sequence[int], stream: TextIO, start: float | None = None):
        self.depths, self.stream = tuple(depths), stream
        self.start = time.perf_counter() if start is None else start
        self.began: dict[int, float] = {}
        self.ended: dict[int, float] = {}

    def header(self) -> None:
        self._print(_ROW.format("Job", "Depth", "Epoch", "Iteration", "Training", "Validation",
                                "Time (s)", "Event").rstrip())

    def __call__(self, job_index: int, message: Mapping) -> None:
        state, depth = message.get("state"), self.depths[job_index]
        now = time.perf_counter() - self.start
        if state == "validation":
            self._row(job_index, depth, now, message.get("epoch", ""),
                      message.get("iteration", ""), _percent(message.get("accuracy")),
                      _percent(message.get("validation_accuracy")))
        elif state in ("start", "done"):
            (self.began if state == "start" else self.ended)[job_index] = now
            self._row(job_index, depth, now, event="started" if state == "start" else "done")
        elif state in ("failed", "cancelled"):
            why = f": {message['error']}" if message.get("error") else ""
            self._row(job_index, depth, now, event=f"{state}{why}")

    def _row(self, job_index, depth, now: float, epoch="", iteration="", training="",
             validation="", event="") -> None:
        self._print(_ROW.format(job_index, depth, epoch, iteration, training, validation,
                                f"{now:.1f}", event).rstrip())

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def _percent(value) -> str:
    return "" if value is None else f"{value:.2f}%"


def print_outcomes(outcomes: Sequence[JobOutcome], table: ProgressTable,
                   stream: TextIO) -> int | None:
    """Print each job's final validation accuracy and timings; the best job's position or None."""
    print("Final validation accuracy:", file=stream)
    for job in outcomes:
        accuracy = job.accuracy
        result = f"{accuracy:.2f}%" if accuracy is not None else (job.error or "no validation")
        if job.info is not None:
            result += f" (compile {job.info.compile_time:.1f} s, training " \
                      f"{job.info.train_time:.1f} s"
            if job.index in table.began and job.index in table.ended:
                result += (f"; first step at {table.began[job.index]:.1f} s, done at "
                           f"{table.ended[job.index]:.1f} s")
            result += ")"
        print(f"  job {job.index} (depth {job.depth}): {result}", file=stream)
    usable = [i for i, job in enumerate(outcomes) if job.accuracy is not None]
    if not usable:
        print("No job finished with a validation accuracy; nothing to test.", file=stream)
        return None
    best = max(usable, key=lambda i: outcomes[i].accuracy)  # ties: the first, as MATLAB's max
    print(f"Best network: depth {outcomes[best].depth} (job {outcomes[best].index}, "
          f"{outcomes[best].accuracy:.2f}%)", file=stream, flush=True)
    return best


def write_metrics(outcomes: Sequence[JobOutcome], out: pathlib.Path) -> dict[int, str]:
    """Write ``metrics-job<i>.csv`` of each job with a history; job index -> file name."""
    written = {}
    for job in outcomes:
        if job.info is None or not hasattr(job.info, "to_csv"):
            continue
        name = f"metrics-job{job.index}.csv"
        if _attempt(lambda: job.info.to_csv(out / name), out / name):  # noqa: B023 (called now)
            written[job.index] = name
    return written


def write_results(path: pathlib.Path, summary: Mapping) -> bool:
    """Write ``summary`` as JSON to ``path`` atomically; whether it was written."""
    return _attempt(lambda: write_json_atomic(path, summary), path)


def summary(outcomes: Sequence[JobOutcome], *, best: int | None, test: Mapping | None,
            metrics: Mapping[int, str], **facts) -> dict:
    """The sweep's results as JSON-able data (what ``sweep_results.json`` holds)."""
    jobs = [{"job": job.index, "depth": job.depth, "status": job.status, "error": job.error,
             "final_validation_accuracy": job.accuracy,
             "stop_reason": getattr(job.info, "stop_reason", None),
             "compile_time": getattr(job.info, "compile_time", None),
             "train_time": getattr(job.info, "train_time", None),
             "metrics_csv": metrics.get(job.index)} for job in outcomes]
    chosen = None if best is None else {"job": outcomes[best].index,
                                        "depth": outcomes[best].depth,
                                        "validation_accuracy": outcomes[best].accuracy,
                                        **(test or {})}
    return {**facts, "jobs": jobs, "best": chosen}


def save_figure(save, path: pathlib.Path) -> bool:
    """Call ``save(path)``; on failure print a warning naming ``path`` and go on."""
    return _attempt(lambda: save(path), path)


def _attempt(write, path: pathlib.Path) -> bool:
    try:
        write()
    except Exception as error:  # noqa: BLE001 (an output lost costs only itself)
        print(f"warning: could not write {path}: {type(error).__name__}: {error}",
              file=sys.stderr, flush=True)
        return False
    return True
