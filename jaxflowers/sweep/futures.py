"""The futures a sweep hands out, the errors of failed jobs, and ``fetch_outputs``.

A ``JobFuture`` stays pending while its job runs, so ``cancel()`` can kill a running job.
"""
from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import CancelledError, Future, wait
from typing import Any, Callable, Iterable

from jaxflowers.sweep import transfer

__all__ = ["JobError", "JobFuture", "JobTimeoutError", "fetch_outputs", "wait_jobs"]


class JobError(RuntimeError):
    """A sweep job raised, exited non-zero, was killed by a signal or timed out.

    Attributes: ``job_index``, ``exit_code`` (None after a signal), ``signal_name`` (e.g.
    "SIGKILL", else None), ``log_tail`` (the last lines of the job's log) and ``error_type``
    (the class name of what the job raised, else None).
    """

    def __init__(self, job_index: int, reason: str, *, exit_code: int | None = None,
                 signal_name: str | None = None, log_tail: str = "",
                 error_type: str | None = None):
        self.job_index, self.exit_code, self.signal_name = job_index, exit_code, signal_name
        self.log_tail, self.error_type = log_tail, error_type
        text = f"job {job_index} {reason}"
        if log_tail.strip():
            text += "\n--- last lines of its log ---\n" + log_tail.rstrip()
        super().__init__(text)


class JobTimeoutError(JobError, TimeoutError):
    """A job ran longer than its ``timeout`` and was killed."""


class JobFuture(Future):
    """A ``concurrent.futures.Future`` of one job (MATLAB: ``parallel.FevalFuture``) whose
    ``cancel()`` also stops a running job; ``job_index`` is its number in the pool, ``slot``
    where it runs once started (``slot.where`` in words)."""

    def __init__(self, job_index: int, *, stop_job: Callable[[int], bool],
                 job_running: Callable[[int], bool]):
        super().__init__()
        self.job_index = job_index
        self.slot = None
        self._stop_job, self._job_running = stop_job, job_running
        self._cancel_lock, self._rebuild_lock = threading.Lock(), threading.Lock()
        self._rebuilt: tuple[Any] | None = None

    def cancel(self) -> bool:
        """Cancel the job, killing it if it runs (MATLAB: ``cancel(F)``); False once ended."""
        with self._cancel_lock:
            if self.cancelled():
                return True
            if not self._stop_job(self.job_index) or not super().cancel():
                return False
            self.set_running_or_notify_cancel()  # wakes wait() and as_completed() now
            return True

    def running(self) -> bool:
        """Whether the job has started and not yet ended."""
        return not self.done() and self._job_running(self.job_index)

    def result(self, timeout: float | None = None) -> Any:
        """The job's return value (rebuilt on first access; may import JAX), or raise its error."""
        value = super().result(timeout)
        with self._rebuild_lock:
            if self._rebuilt is None:
                self._rebuilt = (transfer.rebuild(value),)
            return self._rebuilt[0]

    def __repr__(self) -> str:
        state = ("cancelled" if self.cancelled() else "finished" if self.done() else
                 "running" if self.running() else "pending")
        return f"<JobFuture job {self.job_index} {state}>"


def wait_jobs(futures, timeout: float | None = None):
    """``concurrent.futures.wait`` that keeps live figure windows drawn meanwhile (their
    toolkit runs in this thread; the pool's messages arrive in another).

    Returns:
      ``(done, not_done)``, sets of futures, as ``concurrent.futures.wait``.
    """
    backend = sys.modules.get("jaxflowers.plots.backend")  # not imported: no window is open
    if backend is None or not backend.windows_open():
        return wait(futures, timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, not_done = wait(futures, 0.2 if left is None else min(0.2, left))
        backend.pump_windows()
        if not not_done or left == 0.0:
            return done, not_done


def fetch_outputs(futures: Iterable[Future], *, unpack: bool = True,
                  timeout: float | None = None) -> list | tuple[list, ...]:
    """Wait for every job and return their outputs in order (MATLAB: ``fetchOutputs(F)``).

    Args:
      futures: futures from ``DevicePool.submit`` (any ``Future`` works).
      unpack: when every job returned a tuple of one length, return one list per output
        (``nets, infos = fetch_outputs(futures)``); False: the plain list.
      timeout: seconds to wait for all jobs; None waits for ever.

    Raises:
      JobError: the error of the first failed job (it names the job index).
      CancelledError: the first unsuccessful job was cancelled.
      TimeoutError: jobs are still running after ``timeout`` seconds.
    """
    futures = list(futures)
    _, not_done = wait_jobs(futures, timeout)
    if not_done:
        raise TimeoutError(f"{len(not_done)} of {len(futures)} jobs still running "
                           f"after {timeout} s")
    outputs = []
    for position, future in enumerate(futures):
        index = getattr(future, "job_index", position)
        if future.cancelled():
            raise CancelledError(f"job {index} was cancelled")
        error = future.exception()
        if isinstance(error, JobError):
            raise error
        if error is not None:
            raise JobError(index, f"raised {type(error).__name__}: {error}") from error
        outputs.append(future.result())
    lengths = {len(o) if isinstance(o, tuple) else -1 for o in outputs}
    if unpack and outputs and len(lengths) == 1 and lengths.pop() >= 0:
        return tuple(list(column) for column in zip(*outputs))
    return outputs
