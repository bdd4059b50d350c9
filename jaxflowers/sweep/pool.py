"""``DevicePool``: run job functions on every GPU (or CPU slot) side by side.

MATLAB: a parallel pool with ``parfeval``, ``fetchOutputs``, ``cancel`` and a DataQueue's
``afterEach``. The pool owns the scheduling (a FIFO queue of jobs, one slot per job that
may run, or whole devices for a job over several, timeouts, cancellation, the
``after_each`` callbacks); a backend owns the processes: ``local`` (one subprocess per
job, ``local.py``) or ``ray`` (``ray_cluster.py``).

Nothing here imports JAX: the caller must not hold a GPU while its workers start.
"""
from __future__ import annotations

import collections
import functools
import os
import threading
from concurrent.futures import wait
from typing import Any, Callable, Sequence

from jaxflowers.sweep import shutdown as interrupts
from jaxflowers.sweep import slots as placement
from jaxflowers.sweep import transfer
from jaxflowers.sweep.backends.base import Backend, Job, JobEvents
from jaxflowers.sweep.events import EventDispatcher
from jaxflowers.sweep.futures import JobError, JobFuture, JobTimeoutError
from jaxflowers.sweep.slots import make_slots

# The "state" of the messages train_job sends (train's output_fn) and the pool adds.
MESSAGE_STATES = ("start", "iteration", "validation", "done", "failed", "cancelled")


class _OnlyStates:
    """An ``after_each`` callback that sees only messages of some states."""

    def __init__(self, callback: Callable[[int, dict], Any], states: frozenset[str]):
        self.callback, self.states = callback, states

    def __call__(self, job_index: int, message: dict) -> None:
        if message.get("state") in self.states:
            self.callback(job_index, message)

    def __repr__(self) -> str:
        return f"{self.callback!r} (states {sorted(self.states)})"


class DevicePool:
    """A pool of job slots: ``jobs_per_device`` per GPU, or CPU slots without a GPU.

    MATLAB: ``parpool`` + ``parfeval``. Use it as a context manager, or call ``shutdown``.

    Args:
      devices: "all" (every visible GPU, counted without importing JAX; without a GPU,
        ``max(2, cpu_count // 8)`` CPU slots), an int n (the first n GPUs, or n CPU slots
        without GPUs), or a list of GPU indices/UUIDs. On Ray, GPUs are the cluster's and
        only their number matters (Ray places the tasks); a cluster without GPUs has one
        CPU slot per 8 cores of each node (at least one per node).
      jobs_per_device: jobs packed on each GPU; each then gets ``0.9 / jobs_per_device``
        of its memory (see ``memory_fraction``) and no preallocation.
      backend: "local" (subprocesses on this machine) or "ray" (tasks on a Ray cluster;
        needs the ``ray`` extra).
      log_dir: folder for the per-job logs ``job-0000.log``...; None keeps them in a
        temporary folder removed at shutdown.
      memory_fraction: GPU memory fraction per job (``XLA_PYTHON_CLIENT_MEM_FRACTION``).
      address: the Ray cluster to join ("HOST:PORT", "ray://HOST:10001" or "auto");
        default ``$RAY_ADDRESS``; with neither, a local Ray is started. Ray backend only;
        it prints one line saying which cluster it joined.
    """

    def __init__(self, devices: str | int | Sequence[int | str] = "all", jobs_per_device: int = 1,
                 backend: str = "local", *, log_dir: str | os.PathLike | None = None,
                 memory_fraction: float | None = None, address: str | None = None):
        if memory_fraction is not None and not 0 < memory_fraction <= 1:
            raise ValueError(f"memory_fraction={memory_fraction!r} must lie in (0, 1]")
        self._backend = _make_backend(backend, log_dir=log_dir, address=address,
                                      memory_fraction=memory_fraction)
        try:
            self._slots = make_slots(devices, jobs_per_device, self._backend.gpus(),
                                     self._backend.cpu_slots())
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
        """Schedule ``fn(*args, **kwargs)`` in a worker; returns its future at once.

        MATLAB: ``parfeval(pool, fcn, numout, X1, ...)``.

        Args:
          fn: a top-level function of an importable module, or "module:qualname".
          *args, **kwargs: JSON-able values (nested lists, tuples, str-keyed dicts) and
            numpy arrays (handed over as read-only memory-mapped files).
          timeout: seconds the job may run once started (on Ray: once handed to Ray);
            then it is killed and its future fails with ``JobTimeoutError``. None: no limit.
          num_devices: devices the job trains on. A job of several devices waits until that
            many devices have no other job, then owns them whole (every slot of each); the
            devices it waits for take no new job meanwhile, while other devices go on.

        Returns:
          A ``JobFuture`` (a ``concurrent.futures.Future``) with ``job_index``; its
          ``slot`` says where the job runs once it has started.

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
        return job.future

    def after_each(self, callback: Callable[[int, dict], Any] | None = None, *,
                   states: Sequence[str] | None = None):
        """Call ``callback(job_index, message)`` for every ``report(message)`` of every job.

        MATLAB: ``afterEach(queue, fcn)``. Callbacks run on one pool thread of the caller's
        process, in the order each job sent its messages, and before that job's future
        completes. Messages sent before the first callback is registered are kept and
        delivered to it. For a job that fails or is cancelled the pool adds a last message
        ``{"state": "failed", "error": str}`` or ``{"state": "cancelled"}``, as
        ``plots.sweep_progress`` expects. Usable as a decorator (``@pool.after_each`` or
        ``@pool.after_each(states=...)``); returns ``callback``.

        Args:
          callback: the function to call.
          states: only messages whose "state" is one of these (``MESSAGE_STATES``:
            "start", "iteration", "validation", "done", "failed", "cancelled"); None: all.
            ``states=("validation", "done", "failed", "cancelled")`` gives a line per
            validation and job end instead of one per iteration.
        """
        if callback is None:
            return functools.partial(self.after_each, states=states)
        if states is not None:
            states = frozenset([states] if isinstance(states, str) else states)
            unknown = sorted(states - set(MESSAGE_STATES))
            if unknown:
                raise ValueError(f"after_each(states=...): {unknown} are not message states; "
                                 f"use some of {', '.join(MESSAGE_STATES)}")
        self._events.add_callback(callback if states is None else _OnlyStates(callback, states))
        return callback

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting jobs, like ``concurrent.futures.Executor.shutdown``.

        Args:
          wait: block until every running and queued job has finished.
          cancel_futures: cancel the queued jobs (running ones go on).
        """
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

    def _start(self, job: Job, held: list) -> None:
        """Start ``job`` on the slots ``held`` (call with the lock held)."""
        slot = placement.merge(held)
        job.state, job.slot, job.held, job.future.slot = "running", slot, tuple(held), slot
        self._running[job.index] = job
        events = JobEvents(message=functools.partial(self._events.put, job.index),
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

    def _stop(self, job_index: int) -> bool:
        """Stop a job for ``JobFuture.cancel``: drop it from the queue or kill it. Returns
        whether its future should end cancelled (False once it ended by itself)."""
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
        """``JobEvents.finished`` of ``job``: free its slot, then complete its future."""
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
        """Wait until no job is queued or running (processes gone) and all futures are done."""
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
        """Stop everything now: cancel queued jobs, kill running ones and close the pool.

        MATLAB: ``delete(pool)``. Running jobs get SIGTERM, then SIGKILL after ``grace``
        seconds (Ray tasks are force-cancelled); their futures end cancelled. Called on
        SIGINT, SIGTERM and interpreter exit; safe inside a signal handler.
        """
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


def _make_backend(name: str, *, log_dir, address, memory_fraction) -> Backend:
    if name == "local":
        if address is not None:
            raise ValueError("address= is for backend='ray'; the local backend has none")
        from jaxflowers.sweep.backends.local import LocalBackend

        return LocalBackend(log_dir=log_dir, memory_fraction=memory_fraction)
    if name == "ray":
        from jaxflowers.sweep.backends.ray_cluster import RayBackend

        return RayBackend(log_dir=log_dir, address=address, memory_fraction=memory_fraction)
    raise ValueError(f"backend={name!r}: use 'local' or 'ray'")
