"""The Ray backend: ``DevicePool(backend="ray")`` runs each job as a Ray task.

Each job is one streaming-generator task (``num_returns="streaming"``, ``max_retries=0``,
``num_gpus=1/jobs_per_device`` on GPU clusters) that yields ``("message", dict)`` for every
``report`` and finally ``("done", outcome)``. Inside the task the job runs in the same
worker subprocess as the local backend, so a segfault or an out-of-memory kill still comes
back as an exit code or signal name with the log tail instead of a bare "worker died".
Cancelling is ``ray.cancel`` (the task then kills the job's process group), then
``ray.cancel(force=True)`` a second later if needed (the worker exits when its parent, the
Ray worker, dies; processes the job itself started may then survive unless the cluster
runs with ``RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper=true``).
Payloads are JSON-able data and npz bytes; the job function travels as a
"module:qualname" string (Ray's own transport of those plain values is its business).
Ray must be able to import ``jaxflowers`` and the job's module on its nodes: install them
there; from a checkout, the package's folder is put in front of each node's own
PYTHONPATH (Ray expands ``${PYTHONPATH}`` to the node's value).
"""
from __future__ import annotations

import io
import json
import os
import pathlib
import queue
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

from jaxflowers.host.processes import package_path
from jaxflowers.sweep import slots as devices
from jaxflowers.sweep.backends.base import Job, JobEvents
from jaxflowers.sweep.backends.process import WorkerProcess, outcome, to_result, write_spec
from jaxflowers.sweep.futures import JobError


def _import_ray():
    try:
        import ray
    except ImportError as error:
        raise ImportError("DevicePool(backend='ray') needs Ray: pip install 'jaxflowers[ray]'"
                          ) from error
    return ray


def join(ray, address: str | None) -> str:
    """Initialise Ray (unless this process has already) and say where, in one line.

    ``address`` (or ``$RAY_ADDRESS``) names a cluster to join ("auto": the one started on
    this machine with ``ray start``); with neither, a local Ray is started for this process.
    """
    if ray.is_initialized():
        how = "Ray: using the cluster this process had joined"
    elif address or os.environ.get("RAY_ADDRESS"):
        where = address or os.environ["RAY_ADDRESS"]
        try:
            ray.init(address=address)
        except ConnectionError as error:
            if "auth" in f"{error} {error.__cause__}".lower():
                raise ConnectionError(
                    f"the Ray cluster at {where} requires its authentication token: set "
                    "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (`ray get-auth-token` on the head "
                    "node prints it), or copy the head's ~/.ray/auth_token here") from error
            raise
        how = f"Ray: joined the cluster at {where}"
    else:
        ray.init(address="local")
        how = ("Ray: started a local Ray for this process (give address= or set RAY_ADDRESS "
               "to join a cluster)")
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    total = ray.cluster_resources()
    return (f"{how}: {len(nodes)} node(s), {int(total.get('GPU', 0))} GPU(s), "
            f"{int(total.get('CPU', 0))} CPU(s)")


class RayBackend:
    """Runs a ``DevicePool``'s jobs as Ray tasks (see ``DevicePool(backend="ray")``).

    Joins the cluster at ``address`` (see :func:`join`) unless Ray is already initialised,
    and prints one line saying which; it never shuts Ray down, as other code of the caller
    may use it.
    """

    name = "ray"

    def __init__(self, *, log_dir=None, address: str | None = None,
                 memory_fraction: float | None = None):
        self._ray = ray = _import_ray()
        self.cluster = join(ray, address)
        print(self.cluster, flush=True)
        self._scratch = pathlib.Path(tempfile.mkdtemp(prefix="jaxflowers-sweep-ray-"))
        self.log_dir = pathlib.Path(log_dir) if log_dir is not None else self._scratch / "logs"
        self._memory_fraction = memory_fraction
        # Ray imports this module on its workers; from a source checkout it is not on their
        # path unless we say where it is (harmless where jaxflowers is installed). The
        # node's own PYTHONPATH stays behind it: Ray expands ${PYTHONPATH} on the node.
        path = package_path("${PYTHONPATH}")
        self._task = ray.remote(num_returns="streaming", max_retries=0,
                                runtime_env={"env_vars": {"PYTHONPATH": path}})(_run_job)

    def gpus(self) -> list[str]:
        """One entry per GPU of the cluster (Ray, not the pool, decides which GPU runs what)."""
        return [str(i) for i in range(int(self._ray.cluster_resources().get("GPU", 0)))]

    def cpu_slots(self) -> int:
        """CPU job slots of a cluster without GPUs: each live node's share by the local rule
        (``devices.default_cpu_slots``: one per 8 cores), at least one per node."""
        return sum(max(1, int(node["Resources"].get("CPU", 0)) // 8)
                   for node in self._ray.nodes() if node.get("Alive"))

    def prepare(self, reference: dict, arguments, arrays: dict) -> tuple[str, bytes]:
        """The job as (JSON text, npz bytes of its array arguments)."""
        spec = {**reference, "arguments": arguments,
                "sys_path": [p for p in sys.path if isinstance(p, str)]}
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return json.dumps(spec), buffer.getvalue()

    def discard(self, staged) -> None:
        """Nothing to clean: a staged Ray job is only bytes."""

    def start(self, job: Job, slot: devices.Slot, events: JobEvents) -> None:
        """Submit ``job``'s task; a thread forwards its messages and its end to ``events``."""
        gpu = slot.gpu is not None
        share = slot.num_devices / slot.jobs_per_device  # several devices: whole ones
        resources = {"num_gpus": share, "num_cpus": 0} if gpu else {"num_cpus": share}
        settings = {"job_index": job.index, "gpu": gpu, "jobs_per_device": slot.jobs_per_device,
                    "num_devices": slot.num_devices,
                    "memory_fraction": self._memory_fraction, "log_dir": str(self.log_dir)}
        job.handle = self._task.options(**resources).remote(*job.staged, settings)
        threading.Thread(target=self._watch, args=(job, events), daemon=True,
                         name=f"sweep-job-{job.index}-ray").start()

    def kill(self, job, grace: float = 1.0) -> None:
        """Cancel the job's task, like SIGTERM then SIGKILL: ``ray.cancel`` interrupts it
        (its cleanup kills the job's whole process group), and ``ray.cancel(force=True)``
        kills the Ray worker after ``grace`` seconds if the task is still there."""
        self._cancel(job, force=False)
        timer = threading.Timer(grace, self._force, (job,))
        timer.daemon = True
        timer.start()

    def kill_all(self, jobs, grace: float) -> None:
        """Cancel every task in ``jobs``, waiting up to ``grace`` s before forcing it."""
        jobs = [job for job in jobs if job.handle is not None]
        for job in jobs:
            self._cancel(job, force=False)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(job.state != "done" for job in jobs):
            time.sleep(0.02)
        for job in jobs:
            self._force(job)

    def _force(self, job) -> None:
        if job.state != "done":
            self._cancel(job, force=True)

    def _cancel(self, job, *, force: bool) -> None:
        try:
            self._ray.cancel(job.handle, force=force)
        except Exception:  # noqa: BLE001 (already finished, or Ray is shutting down)
            pass

    def close(self) -> None:
        """Remove the local scratch folder (and the logs, unless in a given log_dir)."""
        shutil.rmtree(self._scratch, ignore_errors=True)

    def _watch(self, job: Job, events: JobEvents) -> None:
        done = None
        try:
            for ref in job.handle:
                kind, payload = self._ray.get(ref)
                if kind == "message":
                    events.message(payload)
                else:
                    done = payload
            value, error = to_result(job.index, done) if done else \
                (None, JobError(job.index, "ended without a result"))
        except Exception as failure:  # noqa: BLE001 (cancelled, node lost, ...)
            value, error = None, JobError(
                job.index, f"failed in Ray: {type(failure).__name__}: {failure}")
        events.finished(value, error)


def _run_job(spec_json: str, npz: bytes, settings: dict):
    """The Ray task: run one job in a worker subprocess on this node and stream its
    messages, then ``("done", outcome)`` (see ``process.outcome``)."""
    spec = json.loads(spec_json)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="jaxflowers-ray-job-"))
    worker = None
    try:
        with np.load(io.BytesIO(npz), allow_pickle=False) as arrays:
            write_spec(folder, {"ref": spec["ref"], "main_path": spec["main_path"]},
                       spec["arguments"], {k: arrays[k] for k in arrays.files}, spec["sys_path"])
        worker = WorkerProcess(folder, _task_environment(settings), _log_path(folder, settings))
        for message in _messages(worker):
            yield "message", message
        yield "done", outcome(folder, worker.wait(), worker.log_path)
    finally:  # also on ray.cancel, which raises KeyboardInterrupt here
        if worker is not None and worker.running():
            worker.kill()  # the whole process group: the job's own children too
        shutil.rmtree(folder, ignore_errors=True)


def _messages(worker: WorkerProcess):
    """The worker's messages, read by a thread and polled here in short waits so that
    ``ray.cancel`` (a KeyboardInterrupt in this thread) is never stuck in a pipe read."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read():
        for message in worker.messages():
            inbox.put(message)
        inbox.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            message = inbox.get(timeout=0.1)
        except queue.Empty:
            continue
        if message is None:
            return
        yield message


def _task_environment(settings: dict) -> dict:
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "") if settings["gpu"] else None
    count = settings.get("num_devices", 1)
    slot = devices.Slot(settings["job_index"], gpu or None, settings["jobs_per_device"],
                        devices=tuple(range(count)) if count > 1 else ())
    return devices.slot_environment(slot, os.environ, memory_fraction=settings["memory_fraction"])


def _log_path(folder: pathlib.Path, settings: dict) -> pathlib.Path:
    """The caller's log_dir when this node can write there (same machine or shared
    storage), else the task's own folder (the log tail still travels back on failure)."""
    name = f"job-{settings['job_index']:04d}.log"
    try:
        log_dir = pathlib.Path(settings["log_dir"])
        log_dir.mkdir(parents=True, exist_ok=True)
        return log_dir / name
    except OSError:
        return folder / name
