"""The futures a sweep hands out, the errors a failed job raises, and ``fetch_outputs``.

A ``JobFuture`` is a real ``concurrent.futures.Future`` (``as_completed``, ``wait`` and
``add_done_callback`` work), with one difference MATLAB users expect from ``cancel(F)``:
cancelling a *running* job kills it instead of being refused.
"""
from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future, wait
from concurrent.futures._base import CANCELLED_AND_NOTIFIED, RUNNING
from typing import Any, Callable, Iterable

from jaxflowers.sweep import codec


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

    Attributes:
      job_index: the job's number in its pool.
    """

    def __init__(self, job_index: int, canceller: Callable[["JobFuture"], bool]):
        super().__init__()
        self.job_index = job_index
        self._canceller = canceller
        self._rebuild_lock = threading.Lock()
        self._rebuilt = False

    def cancel(self) -> bool:
        """Cancel the job, queued or running (a running one is killed, its slot freed).

        MATLAB: ``cancel(F)``. Returns False only when the job has already finished.
        """
        return self._canceller(self)

    def result(self, timeout: float | None = None) -> Any:
        """The job's return value (waits up to ``timeout`` s); raises its error otherwise.

        Values a library job returns in tagged form (``train_job``'s network and info) are
        rebuilt here, in the caller's thread, on first access: this may import JAX.
        """
        value = super().result(timeout)
        with self._rebuild_lock:
            if not self._rebuilt:
                self._result = value = codec.rebuild_tagged(value)
                self._rebuilt = True
            return self._result

    def _cancel_queued(self) -> bool:
        """Cancel a job that never started, and tell ``wait``/``as_completed`` at once."""
        if Future.cancel(self):
            if not self.set_running_or_notify_cancel():
                return True
        return self.cancelled()

    def _cancel_running(self) -> bool:
        """Mark a running job cancelled (its process is being killed) and notify waiters."""
        with self._condition:
            if self._state != RUNNING:
                return self.cancelled()
            self._state = CANCELLED_AND_NOTIFIED
            for waiter in self._waiters:
                waiter.add_cancelled(self)
            self._condition.notify_all()
        self._invoke_callbacks()
        return True


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
