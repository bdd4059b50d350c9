"""The futures a sweep hands out, the errors a failed job raises, and ``fetch_outputs``.

A ``JobFuture`` is a real ``concurrent.futures.Future`` (``as_completed``, ``wait`` and
``add_done_callback`` work), with one difference MATLAB users expect from ``cancel(F)``:
cancelling a *running* job kills it instead of being refused. It uses only the public
``Future`` API for that: the future stays pending while the job runs.
"""
from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future, wait
from typing import Any, Callable, Iterable

from jaxflowers.sweep import transfer


class JobError(RuntimeError):
    """A sweep job failed: it raised, exited non-zero, was killed by a signal or timed out.

    Attributes:
      job_index: the job's number in its pool (0 for the first ``submit``).
      exit_code: the worker's exit status, or None (killed by a signal, or unknown).
      signal_name: e.g. "SIGSEGV" or "SIGKILL" when a signal ended the job, else None.
      log_tail: the last lines of the job's log (its prints and traceback).
      error_type: the exception class name when the job raised, else None.
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
    """A ``concurrent.futures.Future`` for one sweep job (MATLAB: a ``parallel.FevalFuture``).

    The future stays pending while its job runs, so ``Future.cancel`` can still cancel it:
    ``cancel()`` stops the job (a running one is killed), then cancels the future through
    the standard API. ``running()`` reports whether the job is running.

    Attributes:
      job_index: the job's number in its pool.
      slot: where the job runs (a ``slots.Slot``; ``slot.where`` in words) once it has
        started; None before.
    """

    def __init__(self, job_index: int, *, stop_job: Callable[[int], bool],
                 job_running: Callable[[int], bool]):
        super().__init__()
        self.job_index = job_index
        self.slot = None
        self._stop_job, self._job_running = stop_job, job_running
        self._cancel_lock, self._rebuild_lock = threading.Lock(), threading.Lock()
        self._rebuilt: tuple[Any] | None = None

    def cancel(self) -> bool:
        """Cancel the job, queued or running (a running one is killed, its slot freed).

        MATLAB: ``cancel(F)``. Returns False only when the job has already finished.
        """
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
        """The job's return value (waits up to ``timeout`` s); raises its error otherwise.

        Values a library job returns in tagged form (``train_job``'s network and info) are
        rebuilt here, in the caller's thread, on first access: this may import JAX.
        """
        value = super().result(timeout)
        with self._rebuild_lock:
            if self._rebuilt is None:
                self._rebuilt = (transfer.rebuild(value),)
            return self._rebuilt[0]

    def __repr__(self) -> str:
        state = ("cancelled" if self.cancelled() else "finished" if self.done() else
                 "running" if self.running() else "pending")
        return f"<JobFuture job {self.job_index} {state}>"


def fetch_outputs(futures: Iterable[Future], *, unpack: bool = True,
                  timeout: float | None = None) -> list | tuple[list, ...]:
    """Wait for every job and return their outputs in the order of ``futures``.

    MATLAB: ``fetchOutputs(F)``; like ``[nets, infos] = fetchOutputs(F)``, jobs that return
    tuples of one length (several outputs) come back as one list per output.

    Args:
      futures: futures from ``DevicePool.submit`` (any ``Future`` works).
      unpack: if False, always return the plain list of return values.
      timeout: seconds to wait for all jobs; None waits for ever.

    Returns:
      ``[out_0, out_1, ...]``, or ``([a_0, a_1, ...], [b_0, b_1, ...])`` when every job
      returned a tuple ``(a, b)``.

    Raises:
      JobError: the error of the first failed job in ``futures`` (it names the job index).
      CancelledError: when the first unsuccessful job was cancelled.
      TimeoutError: when jobs are still running after ``timeout`` seconds.
    """
    futures = list(futures)
    _, not_done = wait(futures, timeout)
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
