"""The local backend: one worker subprocess per job, with a scratch folder, a log file, a
progress pipe and two threads (one reads the progress, one waits for the exit). Warm workers
(``keep_warm``), launched ahead for a slot, take the next job on it without Python's and
JAX's start-up."""
from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import threading
import time

from jaxflowers.host import mps
from jaxflowers.sweep import slots as devices
from jaxflowers.sweep.backends.base import Job, JobEvents
from jaxflowers.sweep.backends.process import WorkerProcess, outcome, to_result, write_spec

__all__ = ["LocalBackend"]

# Read only when a job starts JAX's GPU backend, after a warm worker has its job: a warm worker
# launched for one slot of a GPU serves any slot of it (``jobs_per_device="auto"`` changes
# the memory cap of the slots it adds) and takes these at the hand-over.
_AT_HAND_OVER = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE")


def _launch_environment(env: dict) -> dict:
    """What a warm worker must have been launched with to serve a slot of ``env``."""
    return {name: value for name, value in env.items() if name not in _AT_HAND_OVER}


class LocalBackend:
    """Runs a ``DevicePool``'s jobs as subprocesses (see ``DevicePool(backend="local")``)."""

    name = "local"

    def __init__(self, *, log_dir=None, memory_fraction: float | None = None):
        self._scratch = pathlib.Path(tempfile.mkdtemp(prefix="jaxflowers-sweep-"))
        self.log_dir = pathlib.Path(log_dir) if log_dir is not None else self._scratch / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._memory_fraction = memory_fraction
        self._mps: mps.MpsDaemons | None = None
        self._warm: list[tuple[dict, WorkerProcess]] = []  # (environment, worker), oldest first
        self._warm_lock = threading.Lock()
        self._launched = 0

    def gpus(self) -> list[str]:
        return devices.visible_gpus()

    def share_gpus(self, gpus, while_starting=None) -> str:
        """Run a private MPS daemon per GPU in the scratch folder (``MpsError`` if it fails);
        workers launched by ``while_starting`` join them."""
        self._mps = mps.MpsDaemons(self._scratch, gpus)
        try:
            self._mps.start(while_starting)
        except BaseException:
            self._mps = None
            self._discard_warm()  # launched to join MPS
            raise
        return "mps"

    def cpu_slots(self) -> int:
        return devices.default_cpu_slots()

    def prepare(self, reference: dict, arguments, arrays: dict) -> pathlib.Path:
        folder = pathlib.Path(tempfile.mkdtemp(prefix="job-", dir=self._scratch))
        write_spec(folder, reference, arguments, arrays)
        return folder

    def discard(self, staged: pathlib.Path) -> None:
        shutil.rmtree(staged, ignore_errors=True)

    def keep_warm(self, slots) -> None:
        """Launch warm workers until one waits for each entry of ``slots`` (by environment)."""
        with self._warm_lock:
            waiting = [_launch_environment(env) for env, _ in self._warm]
        for slot in slots:
            env = self._environment(slot)
            if (launch := _launch_environment(env)) in waiting:
                waiting.remove(launch)
                continue
            with self._warm_lock:
                self._launched += 1
                log_path = self._scratch / f"warm-{self._launched}.log"
            worker = WorkerProcess(None, env, log_path)
            with self._warm_lock:
                self._warm.append((env, worker))

    def start(self, job: Job, slot: devices.Slot, events: JobEvents) -> None:
        env = self._environment(slot)
        log_path = self.log_dir / f"job-{job.index:04d}.log"
        job.handle = self._take_warm(env, job.staged, log_path) or WorkerProcess(
            job.staged, env, log_path)
        reader = threading.Thread(target=_pass_messages, args=(job, events), daemon=True,
                                  name=f"sweep-job-{job.index}-progress")
        reader.start()
        threading.Thread(target=self._watch, args=(job, reader, events), daemon=True,
                         name=f"sweep-job-{job.index}-exit").start()

    def _environment(self, slot: devices.Slot) -> dict:
        env = devices.slot_environment(slot, os.environ, memory_fraction=self._memory_fraction)
        if self._mps is not None and slot.gpu in self._mps.gpus:
            env.update(self._mps.environment(slot.gpu))
        return env

    def _take_warm(self, env: dict, folder, log_path) -> WorkerProcess | None:
        """A warm worker launched for ``env``'s GPU, handed the job in ``folder`` and the rest of
        ``env``; None if none is."""
        launch = _launch_environment(env)
        while True:
            with self._warm_lock:
                match = next((entry for entry in self._warm
                              if _launch_environment(entry[0]) == launch), None)
                if match is None:
                    return None
                self._warm.remove(match)
            worker = match[1]
            try:
                worker.assign(folder, log_path, {name: env.get(name) for name in _AT_HAND_OVER})
                return worker
            except OSError:  # it died waiting: reap it, try the next
                worker.discard()

    def kill(self, job) -> None:
        """SIGTERM the job's process group, SIGKILL a second later."""
        job.handle.terminate(grace=1.0)

    def kill_all(self, jobs, grace: float) -> None:
        handles = [job.handle for job in jobs if job.handle is not None]
        for handle in handles:
            handle.terminate(grace=grace)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(h.running() for h in handles):
            time.sleep(0.02)
        for handle in handles:
            handle.kill()

    def close(self) -> None:
        """Stop the MPS daemons; remove the scratch folder (and the logs, unless they live in
        a given log_dir)."""
        self._discard_warm()  # none took a job: stop them before their GPU's daemon
        if self._mps is not None:
            self._mps.stop()
            self._mps = None
        shutil.rmtree(self._scratch, ignore_errors=True)

    def _discard_warm(self) -> None:
        with self._warm_lock:
            warm, self._warm = self._warm, []
        for _, worker in warm:
            worker.discard()

    @staticmethod
    def _watch(job: Job, reader: threading.Thread, events: JobEvents) -> None:
        handle: WorkerProcess = job.handle
        returncode = handle.wait()
        reader.join(timeout=5.0)  # the pipe closes with the process group
        try:
            value, error = to_result(job.index, outcome(job.staged, returncode, handle.log_path))
        except Exception as failure:  # noqa: BLE001 (e.g. the scratch folder was removed)
            value, error = None, failure
        shutil.rmtree(job.staged, ignore_errors=True)
        events.finished(value, error)


def _pass_messages(job: Job, events: JobEvents) -> None:
    for message in job.handle.messages():
        events.message(message)
