"""The Ray backend: ``DevicePool(backend="ray")`` runs each job as a Ray task.

A job is one streaming task (``max_retries=0``) running the local backend's worker subprocess,
so a crash comes back as an exit code or signal with the log tail. Cancelling is
``ray.cancel``, then ``force=True``, which may leave the job's own children running unless the
cluster sets ``RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper=true``. The nodes
must be able to import ``jaxflowers`` and the job's module.
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

from jaxflowers.host.mps import MpsError
from jaxflowers.host.processes import package_path
from jaxflowers.sweep import slots as devices
from jaxflowers.sweep.backends.base import Job, JobEvents
from jaxflowers.sweep.backends.process import WorkerProcess, outcome, to_result, write_spec
from jaxflowers.sweep.futures import JobError

__all__ = ["RayBackend", "join"]


def _import_ray():
    try:
        import ray
    except ImportError as error:
        raise ImportError("DevicePool(backend='ray') needs Ray: pip install 'jaxflowers[ray]'"
                          ) from error
    return ray


def join(ray, address: str | None) -> str:
    """Initialise Ray (unless done) at ``address``, ``$RAY_ADDRESS`` or locally; says where."""
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
    """Runs a ``DevicePool``'s jobs as Ray tasks; joins a cluster, never shuts Ray down."""

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
        """One entry per GPU of the cluster (Ray decides which GPU runs what)."""
        return [str(i) for i in range(int(self._ray.cluster_resources().get("GPU", 0)))]

    def cpu_slots(self) -> int:
        """One CPU slot per 8 cores of each live node, at least one per node."""
        return sum(max(1, int(node["Resources"].get("CPU", 0)) // 8)
                   for node in self._ray.nodes() if node.get("Alive"))

    def prepare(self, reference: dict, arguments, arrays: dict) -> tuple[str, bytes]:
        """The job as (JSON text, npz bytes of its array arguments)."""
        spec = {**reference, "arguments": arguments,
                "sys_path": [p for p in sys.path if isinstance(p, str)]}
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return json.dumps(spec), buffer.getvalue()

    def share_gpus(self, gpus, while_starting=None) -> str:
        """Ray's GPU fractions pack tasks on a GPU; MPS on a cluster's nodes is theirs to run."""
        raise MpsError("the ray backend does not start MPS on its nodes; start it there "
                       "(nvidia-cuda-mps-control -d) or use backend='local'")

    def discard(self, staged) -> None:
        """Nothing to clean: a staged Ray job is only bytes."""

    def keep_warm(self, slots) -> None:
        """Nothing: Ray starts and reuses its own worker processes."""

    def start(self, job: Job, slot: devices.Slot, events: JobEvents) -> None:
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
        """``ray.cancel`` the task (it kills the job's group), ``force=True`` after ``grace`` s."""
        self._cancel(job, force=False)
        timer = threading.Timer(grace, self._force, (job,))
        timer.daemon = True
        timer.start()

    def kill_all(self, jobs, grace: float) -> None:
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
    """The Ray task: run one job in a worker subprocess, yield its messages, then its outcome."""
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
    """The worker's messages, polled in short waits so ``ray.cancel`` never hangs in a read."""
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
    """The caller's log_dir when this node can write there, else the task's own folder."""
    name = f"job-{settings['job_index']:04d}.log"
    try:
        log_dir = pathlib.Path(settings["log_dir"])
        log_dir.mkdir(parents=True, exist_ok=True)
        return log_dir / name
    except OSError:
        return folder / name
