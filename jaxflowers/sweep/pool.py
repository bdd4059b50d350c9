"""``DevicePool``: run job functions on every GPU (or CPU slot) side by side.

The pool schedules (a FIFO queue; one slot per job, or whole devices for a job over
several; timeouts, cancellation, ``after_each``); a backend runs the processes. Nothing here
imports JAX: the caller must not hold a GPU while its workers start.
"""
from __future__ import annotations

import collections
import functools
import logging
import os
import sys
import threading
from concurrent.futures import wait
from typing import Any, Callable, Sequence

from jaxflowers.sweep import shutdown as interrupts
from jaxflowers.sweep import slots as placement
from jaxflowers.sweep import transfer
from jaxflowers.sweep.auto import AutoSizing
from jaxflowers.sweep.backends import make_backend
from jaxflowers.sweep.backends.base import Job, JobEvents
from jaxflowers.sweep.events import MESSAGE_STATES, EventDispatcher, OnlyStates
from jaxflowers.sweep.futures import JobError, JobFuture, JobTimeoutError
from jaxflowers.sweep.slots import make_slots

__all__ = ["DevicePool", "MESSAGE_STATES"]

_log = logging.getLogger(__name__)


class DevicePool:
    """A pool of job slots, ``jobs_per_device`` per GPU (MATLAB: ``parpool``); a context manager.

    Args:
      devices: "all" (every visible GPU; without GPUs ``max(2, cpu_count // 8)`` CPU slots), an
        int n (the first n GPUs, or n CPU slots), or a list of GPU indices/UUIDs. On Ray only the
        number of GPUs matters; without GPUs each node gives one CPU slot per 8 cores.
      jobs_per_device: jobs packed on each GPU, each with ``0.9 / jobs_per_device`` of its memory;
        "auto": one job per GPU first, then as many as its measured memory (``train_job``
        reports it with its first iteration) lets fit, up to ``slots.AUTO_MAX_JOBS`` (printed).
      mps: let packed jobs run at the same time under NVIDIA's MPS (a private daemon per GPU,
        stopped with the pool): "auto" when ``jobs_per_device > 1`` and the environment names
        no MPS server of its own, with a warning if it cannot start (the jobs then take turns
        on their GPU); True: the same, but ``MpsError`` if it cannot; False: never.
      backend: "local" (subprocesses on this machine) or "ray" (needs the ``ray`` extra).
      log_dir: folder of the logs ``job-0000.log``...; None: a temporary folder.
      memory_fraction: GPU memory fraction per job (``XLA_PYTHON_CLIENT_MEM_FRACTION``).
      address: Ray's cluster ("HOST:PORT", "ray://HOST:10001", "auto"); default ``$RAY_ADDRESS``,
        else a local Ray.
      warm_workers: launch a worker per slot with the pool (and one more for a slot whose
        next job waits), which imports JAX and the training code before its job comes, so
        jobs skip seconds of start-up. None: where the slots are GPUs (local backend).

    Attributes:
      sharing: how jobs packed on a GPU share it: "mps", "time-slicing", or None (one each).
    """

    def __init__(self, devices: str | int | Sequence[int | str] = "all",
                 jobs_per_device: int | str = 1,
                 backend: str = "local", *, log_dir: str | os.PathLike | None = None,
                 memory_fraction: float | None = None, address: str | None = None,
                 mps: bool | str = "auto", warm_workers: bool | None = None):
        if memory_fraction is not None and not 0 < memory_fraction <= 1:
            raise ValueError(f"memory_fraction={memory_fraction!r} must lie in (0, 1]")
        if mps not in ("auto", True, False):
            raise ValueError(f"mps={mps!r}: use 'auto', True or False")
        auto = jobs_per_device == "auto"
        self._sizing = AutoSizing() if auto else None  # None: a fixed jobs_per_device
        if auto and backend != "local":
            raise ValueError("jobs_per_device='auto' needs backend='local' (Ray packs tasks "
                             "by GPU fractions fixed at submit)")
        self._backend = make_backend(backend, log_dir=log_dir, address=address,
                                      memory_fraction=memory_fraction)
        try:
            self._slots = make_slots(devices, jobs_per_device, self._backend.gpus(),
                                     self._backend.cpu_slots())
            if warm_workers is None:
                warm_workers = any(slot.gpu is not None for slot in self._slots)
            self._warm_workers = bool(warm_workers)
            # the warm workers import JAX while the MPS servers start: neither needs the other
            launch = (functools.partial(self._backend.keep_warm, self._slots)
                      if self._warm_workers else None)
            self.sharing = placement.sharing(self._slots, self._backend, mps, auto=auto,
                                             while_starting=launch)
            if launch is not None:  # none launched yet, or for an MPS that did not start
                launch()
        except BaseException:
            self._backend.close()
            raise
        self._free = collections.deque(self._slots)
        self._queue: collections.deque[Job] = collections.deque()
        self._running: dict[int, Job] = {}
        self._jobs: list[Job] = []
        self._lock = threading.RLock()  # re-entrant: a signal handler may run under it
        self._idle = threading.Condition(self._lock)  # notified whenever a job ends
        self._shutdown = False
        self._closed = False
        self._events = EventDispatcher()
        interrupts.register(self)

    # ------------------------------------------------------------------ public API

    @property
    def num_jobs(self) -> int:
        """Number of jobs submitted so far."""
        return len(self._jobs)

    @property
    def num_slots(self) -> int:
        """How many jobs run at once (devices x jobs_per_device)."""
        return len(self._slots)

    @property
    def num_devices(self) -> int:
        """How many devices (GPUs, or CPU devices) the slots are spread over."""
        return len({slot.device for slot in self._slots})

    @property
    def backend(self) -> str:
        """"local" or "ray"."""
        return self._backend.name

    @property
    def log_dir(self):
        """The folder holding the jobs' logs (``job-0000.log``, ...)."""
        return self._backend.log_dir

    def submit(self, fn: Callable | str, /, *args: Any, timeout: float | None = None,
               num_devices: int = 1, **kwargs: Any) -> JobFuture:
        """Schedule ``fn(*args, **kwargs)`` in a worker (MATLAB: ``parfeval``); its ``JobFuture``.

        Args:
          fn: a top-level function of an importable module, or "module:qualname".
          *args, **kwargs: JSON-able values and numpy arrays (memory-mapped, read-only in the job).
          timeout: seconds the job may run once started, then it is killed (``JobTimeoutError``).
          num_devices: devices the job trains on; a job of several waits until that many
            devices have no other job, then owns them whole (the devices it waits for take
            no new job meanwhile; the others go on).

        Raises:
          TypeError: ``fn`` is not importable by reference, or an argument is not JSON-able.
          ValueError: a bad ``timeout``, or ``num_devices`` beyond the pool's devices.
          RuntimeError: the pool is shut down.
        """
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout={timeout!r} must be a positive number of seconds")
        self._check_devices(num_devices)
        if self._shutdown:
            raise RuntimeError("cannot submit jobs to a DevicePool after shutdown")
        reference = transfer.job_reference(fn)
        arrays: dict = {}
        arguments = {
            "args": [transfer.encode_tree(v, arrays, what=f"argument {i}")
                     for i, v in enumerate(args)],
            "kwargs": {k: transfer.encode_tree(v, arrays, what=f"argument {k!r}")
                       for k, v in kwargs.items()}}
        staged = self._backend.prepare(reference, arguments, arrays)  # slow for big arrays
        with self._lock:
            if self._shutdown:
                self._backend.discard(staged)
                raise RuntimeError("cannot submit jobs to a DevicePool after shutdown")
            index = len(self._jobs)
            future = JobFuture(index, stop_job=self._stop, job_running=self._is_running)
            job = Job(index, future, reference, staged, timeout, num_devices=num_devices)
            self._jobs.append(job)
            self._queue.append(job)
            self._start_queued()
            self._warm_for_queue()
        return job.future

    def after_each(self, callback: Callable[[int, dict], Any] | None = None, *,
                   states: Sequence[str] | None = None):
        """Call ``callback(job_index, message)`` for every job's ``report`` (MATLAB: ``afterEach``).

        Callbacks run in order on one pool thread, before the job's future completes; messages sent
        earlier wait for the first one. A failed or cancelled job ends with ``{"state": "failed",
        "error": str}`` or ``{"state": "cancelled"}``. Works as a decorator.

        Args:
          callback: the function to call; returned.
          states: only messages whose "state" is one of these (``MESSAGE_STATES``); None: all.
        """
        if callback is None:
            return functools.partial(self.after_each, states=states)
        self._events.add_callback(callback if states is None else OnlyStates(callback, states))
        return callback

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting jobs, like ``concurrent.futures.Executor.shutdown``."""
        with self._lock:
            self._shutdown = True
            cancelled = list(self._queue) if cancel_futures else []
            for job in cancelled:
                self._drop_queued(job)
        for job in cancelled:
            job.future.cancel()  # at once, as the standard executors do
        if wait:
            self._wait_all()
        self._close_if_idle()

    def __enter__(self) -> "DevicePool":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not issubclass(exc_type, Exception):
            self.terminate()  # KeyboardInterrupt, SystemExit: stop the jobs, don't wait
        else:
            self.shutdown(wait=True)

    def __repr__(self) -> str:
        return (f"DevicePool(backend={self.backend!r}, slots={self.num_slots}, "
                f"jobs={self.num_jobs}, running={len(self._running)}, queued={len(self._queue)})")

    # ------------------------------------------------------------------ scheduling

    def _check_devices(self, num_devices: int) -> None:
        devices = self.num_devices
        if self._sizing and num_devices != 1:
            raise ValueError("jobs_per_device='auto' packs jobs of one device; give the pool "
                             "a number of jobs per device for jobs of several")
        if isinstance(num_devices, bool) or not isinstance(num_devices, int) \
                or not 1 <= num_devices <= devices:
            raise ValueError(f"num_devices={num_devices!r} must be an integer from 1 to the "
                             f"pool's {devices} device(s)")

    def _start_queued(self) -> None:
        """Start queued jobs, in order, where they fit (call with the lock held); a job of
        several devices that does not fit yet claims the devices it waits for."""
        claimed: set[int] = set()
        devices = [slot.device for slot in self._slots]
        for job in list(self._queue):
            if self._closed or not self._free:
                return
            if job.state != "queued":  # started or dropped meanwhile (a nested call)
                continue
            held = placement.place(self._free, job.num_devices, avoid=claimed)
            if held is None:
                if job.num_devices > 1:
                    claimed |= placement.claim(self._free, devices, job.num_devices,
                                               avoid=claimed)
                continue
            self._queue.remove(job)
            for slot in held:
                self._free.remove(slot)
            self._start(job, held)

    def _warm_for_queue(self) -> None:
        """Keep a warm worker for each job of one device that waits for a slot (call with
        the lock held)."""
        waiting = sum(1 for job in self._queue if job.num_devices == 1)
        if self._warm_workers and waiting:
            # with "auto", also for the slots it may still add: any worker of a GPU serves them
            slots = self._sizing.warm_targets(self._slots) if self._sizing else self._slots
            try:
                self._backend.keep_warm(placement.spread(slots, waiting))
            except OSError as error:  # the jobs then launch workers of their own
                _log.warning("could not launch a warm worker: %s", error)

    def _start(self, job: Job, held: list) -> None:
        """Start ``job`` on the slots ``held`` (call with the lock held)."""
        slot = placement.merge(held)
        job.state, job.slot, job.held, job.future.slot = "running", slot, tuple(held), slot
        self._running[job.index] = job
        events = JobEvents(message=functools.partial(self._message, job),
                           finished=functools.partial(self._job_ended, job))
        try:
            self._backend.start(job, slot, events)
        except Exception as error:  # noqa: BLE001 (the job fails, the pool goes on)
            self._job_ended(job, None, JobError(job.index, f"could not start: {error}"))
            return
        if job.timeout is not None:
            job.timer = threading.Timer(job.timeout, self._time_out, (job,))
            job.timer.daemon = True
            job.timer.start()

    def _message(self, job: Job, message: dict) -> None:
        """``JobEvents.message``: pass it on; with "auto", size the job's GPU by it."""
        memory = self._sizing.measured(job.slot, message) if self._sizing else None
        if memory:
            self._fill_gpu(job, memory)
        self._events.put(job.index, message)

    def _fill_gpu(self, job: Job, memory: dict) -> None:
        """Open as many slots on ``job``'s GPU as its measured memory lets fit."""
        with self._lock:
            decision = self._sizing.decide(job.slot, memory, len(self._slots))
            if decision is None:
                return
            count, total, added = decision
            self._slots += added
            self._free += added
            self._start_queued()
        print(f"jobs_per_device='auto': job {job.index} takes {memory['peak'] / 2**30:.2f} GiB "
              f"of GPU {job.slot.gpu}'s {total / 2**30:.0f} GiB: {count} jobs at a time on it",
              file=sys.stderr, flush=True)

    @property
    def jobs_per_device(self) -> dict[str, int]:
        """GPU -> the jobs it runs at a time (with "auto": those decided so far)."""
        counts = collections.Counter(s.gpu for s in self._slots if s.gpu is not None)
        return {gpu: self._sizing.decided.get(gpu, n) if self._sizing else n
                for gpu, n in counts.items()}

    def _stop(self, job_index: int) -> bool:
        """Drop or kill a job for ``JobFuture.cancel``; whether its future should end cancelled."""
        job = self._jobs[job_index]
        with self._lock:
            if job.state == "queued":
                self._drop_queued(job)
            elif job.state == "running" and job.stop_reason is None:
                job.stop_reason = "cancel"
                self._backend.kill(job)
            return job.stop_reason in ("cancel", "shutdown")

    def _is_running(self, job_index: int) -> bool:
        return self._jobs[job_index].state == "running"

    def _drop_queued(self, job: Job) -> None:
        """Take a job that never started out of the queue (call with the lock held)."""
        self._queue.remove(job)
        job.state, job.stop_reason = "done", "cancel"
        self._backend.discard(job.staged)
        self._events.complete(job, None, None, cancelled=True)

    def _time_out(self, job: Job) -> None:
        with self._lock:
            if job.state == "running" and job.stop_reason is None:
                job.stop_reason = "timeout"
                self._backend.kill(job)

    def _job_ended(self, job: Job, value: Any, error: BaseException | None) -> None:
        """``JobEvents.finished``: free the job's slot, then complete its future."""
        with self._lock:
            if job.state == "done":
                return
            job.state = "done"
            if job.timer is not None:
                job.timer.cancel()
            self._running.pop(job.index, None)
            self._free.extend(job.held)
            reason = job.stop_reason
            self._start_queued()
            self._idle.notify_all()
        if reason == "timeout":
            tail = error.log_tail if isinstance(error, JobError) else ""
            error = JobTimeoutError(job.index, f"timed out after {job.timeout} s and was killed",
                                    log_tail=tail)
        self._events.complete(job, value, error, cancelled=reason in ("cancel", "shutdown"))
        self._close_if_idle()

    # ------------------------------------------------------------------ ending

    def _wait_all(self) -> None:
        with self._idle:
            while self._queue or self._running:
                self._idle.wait()
        wait([job.future for job in self._jobs])

    def _close_if_idle(self) -> None:
        with self._lock:
            if not self._shutdown or self._closed or self._queue or self._running:
                return
            self._closed = True
        self._events.close()
        self._backend.close()
        interrupts.unregister(self)

    def terminate(self, grace: float = 1.0) -> None:
        """Cancel queued jobs, kill running ones (SIGTERM, SIGKILL after ``grace`` s) and close the
        pool now (MATLAB: ``delete(pool)``). Safe inside a signal handler."""
        locked = self._lock.acquire(timeout=2.0)
        try:
            self._shutdown = True
            queued, running = list(self._queue), list(self._running.values())
            for job in queued:
                self._drop_queued(job)
            for job in running:
                job.stop_reason = "cancel" if job.stop_reason == "cancel" else "shutdown"
        finally:
            if locked:
                self._lock.release()
        self._backend.kill_all(running, grace)
        for job in running:  # at exit their backend threads may never run again
            self._events.complete(job, None, None, cancelled=True)
        with self._lock:
            if self._closed:
                return
            self._closed = True  # at exit the backend threads may never run again: clean up
        self._events.close()
        self._backend.close()
        interrupts.unregister(self)

