"""The contract between a ``DevicePool`` and its backends: a backend implements
:class:`Backend` and reports each job only through the :class:`JobEvents` of ``start``."""
from __future__ import annotations

import dataclasses
import pathlib
import threading
from typing import Any, Callable, Protocol, Sequence

__all__ = ["Backend", "Job", "JobEvents"]


@dataclasses.dataclass(eq=False)
class Job:
    """One submitted job as the pool and its backend see it."""

    index: int
    future: Any                # its JobFuture
    reference: dict            # transfer.job_reference(fn)
    staged: Any                # what Backend.prepare returned (files or bytes)
    timeout: float | None
    state: str = "queued"      # queued -> running -> done
    stop_reason: str | None = None  # why the pool stops it: cancel | timeout | shutdown
    num_devices: int = 1       # devices it asked for (submit's num_devices)
    slot: Any = None           # the slots.Slot it runs on (merged over its devices)
    held: tuple = ()           # the pool's slots it holds while running
    handle: Any = None         # the backend's process or task (set by Backend.start)
    timer: threading.Timer | None = None


@dataclasses.dataclass(frozen=True)
class JobEvents:
    """Where a backend reports one job, from any thread: ``message(dict)`` per ``report``, in
    order; then once, its processes gone, ``finished(value, None)`` or ``(None, JobError)``."""

    message: Callable[[dict], None]
    finished: Callable[[Any, BaseException | None], None]


class Backend(Protocol):
    """The processes of a pool: ``LocalBackend`` (``local.py``) and ``RayBackend``."""

    name: str  # "local", "ray"
    log_dir: pathlib.Path  # where job-0000.log ... go

    def gpus(self) -> list[str]:
        """One entry per GPU jobs may use (CUDA_VISIBLE_DEVICES tokens locally)."""

    def cpu_slots(self) -> int:
        """How many jobs ``devices="all"`` runs at once where there is no GPU."""

    def share_gpus(self, gpus: Sequence[str],
                   while_starting: Callable[[], None] | None = None) -> str:
        """Let the jobs packed on ``gpus`` run at the same time where the backend can;
        "mps" or "time-slicing" (raises ``MpsError`` with the reason MPS could not start).
        ``while_starting`` runs while MPS starts, its clients' environment already set."""

    def prepare(self, reference: dict, arguments: Any, arrays: dict) -> Any:
        """Stage a job at submit time (encoded arguments and arrays); returns ``Job.staged``."""

    def discard(self, staged: Any) -> None:
        """Drop what ``prepare`` staged for a job that will never start."""

    def keep_warm(self, slots: Sequence[Any]) -> None:
        """Have a worker waiting for each entry of ``slots`` (those already waiting count),
        where the backend can: the local one launches warm workers; Ray reuses its own."""

    def start(self, job: Job, slot: Any, events: JobEvents) -> None:
        """Start ``job`` on ``slot`` (set ``job.handle``) and report it through ``events``."""

    def kill(self, job: Job) -> None:
        """Stop a running job soon (its ``events.finished`` still follows)."""

    def kill_all(self, jobs: Sequence[Job], grace: float) -> None:
        """Stop ``jobs`` now, waiting at most ``grace`` s before forcing them (at exit)."""

    def close(self) -> None:
        """Release what the backend holds (scratch folders); jobs are gone by then."""
