"""NVIDIA's Multi-Process Service for processes that share a GPU.

Without MPS, CUDA gives the processes on one GPU turns (time-slicing), so small trainings
packed on a GPU run one after another; under an MPS server their kernels run at the same
time. ``MpsDaemons`` runs one private control daemon per GPU, its pipes and logs in a folder
of the caller's, and says what a client's environment needs.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping, Sequence

from jaxflowers.host import gpus as gpu_listing

__all__ = ["MpsDaemons", "MpsError", "configured"]

CONTROL = "nvidia-cuda-mps-control"
_SOCKET_PATH_MAX = 100  # a UNIX socket's path (pipe folder + "/control") must stay under 108
# A client under MPS: creating a context on the one GPU the server shows starts the server.
_PROBE = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
device, context = ctypes.c_int(), ctypes.c_void_p()
for step, call in (("cuInit", lambda: cuda.cuInit(0)),
                   ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(device), 0)),
                   ("cuDevicePrimaryCtxRetain",
                    lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))):
    status = call()
    if status:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(status, ctypes.byref(name))
        sys.exit(f"{step} returned {status} ({(name.value or b'?').decode()})")
cuda.cuDevicePrimaryCtxRelease(device)
"""


class MpsError(RuntimeError):
    """MPS could not start on this machine; the message says why and where its log is."""


class MpsDaemons:
    """One MPS control daemon per GPU, private to its owner (a sweep's pool).

    Args:
      folder: where the daemons' pipe and log folders go (removed by the owner).
      gpus: CUDA_VISIBLE_DEVICES tokens (index or UUID) of the GPUs to share.
    """

    def __init__(self, folder: str | os.PathLike, gpus: Sequence[str],
                 physical: Sequence[tuple[str, str]] | None = None):
        self.gpus = list(dict.fromkeys(gpus))
        # A client names its GPU by UUID: right whether CUDA reads the name against the
        # machine's GPUs or against the one its server shows.
        physical = gpu_listing.physical_gpus() if physical is None else list(physical)
        self._uuids = {gpu: _uuid(gpu, physical) for gpu in self.gpus}
        base = pathlib.Path(folder)
        if len(str(base)) + 20 > _SOCKET_PATH_MAX:  # long $TMPDIR: sockets go to /tmp
            base = pathlib.Path(tempfile.mkdtemp(prefix="jf-mps-", dir="/tmp"))
            self._own_base = base
        else:
            self._own_base = None
        self._folders = {gpu: base / f"mps-{i}" for i, gpu in enumerate(self.gpus)}
        self._running: list[str] = []

    def environment(self, gpu: str) -> dict[str, str]:
        """What a client process on ``gpu`` sets in its environment to join that GPU's server."""
        folder = self._folders[gpu]
        return {"CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
                "CUDA_VISIBLE_DEVICES": self._uuids[gpu]}

    def start(self, while_starting: Callable[[], None] | None = None) -> None:
        """Start every GPU's daemon and check that a client can join it.

        Args:
          while_starting: called once the daemons run, before the check (which starts the
            servers): e.g. launching the clients, which join later.

        Raises:
          MpsError: ``nvidia-cuda-mps-control`` is missing, a daemon did not start, or a client
            could not join (its message and the daemon's log tail); nothing is left running.
        """
        control = shutil.which(CONTROL)
        if control is None:
            raise MpsError(f"{CONTROL} is not on PATH (it comes with the NVIDIA driver)")
        try:
            for gpu in self.gpus:
                self._start_one(control, gpu)
            if while_starting is not None:
                while_starting()
            with ThreadPoolExecutor(len(self.gpus)) as pool:
                list(pool.map(self._probe, self.gpus))
        except BaseException:
            self.stop()
            raise

    def _start_one(self, control: str, gpu: str) -> None:
        env = self._daemon_env(gpu)
        for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
            os.makedirs(env[key], exist_ok=True)
        try:
            result = subprocess.run([control, "-d"], env=env, capture_output=True, text=True,
                                    timeout=30)
        except (OSError, subprocess.SubprocessError) as error:
            raise MpsError(f"{CONTROL} -d for GPU {gpu} failed: {error}") from None
        if result.returncode != 0:
            raise MpsError(f"{CONTROL} -d for GPU {gpu} exited with {result.returncode}: "
                           f"{(result.stderr or result.stdout).strip()}{self._log_tail(gpu)}")
        self._running.append(gpu)

    def _probe(self, gpu: str) -> None:
        env = {**os.environ, **self.environment(gpu)}
        try:
            result = subprocess.run([sys.executable, "-c", _PROBE], env=env,
                                    capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as error:
            raise MpsError(f"a client could not join MPS on GPU {gpu}: {error}") from None
        if result.returncode != 0:
            raise MpsError(f"a client could not join MPS on GPU {gpu}: "
                           f"{result.stderr.strip()[-500:]}{self._log_tail(gpu)}")

    def stop(self, timeout: float = 10.0) -> None:
        """Ask every running daemon to quit (its server ends with it); wait up to ``timeout``."""
        control = shutil.which(CONTROL)
        deadline = time.monotonic() + timeout
        for gpu in self._running:
            if control is None:
                break
            try:
                subprocess.run([control], input="quit\n", env=self._daemon_env(gpu),
                               capture_output=True, text=True,
                               timeout=max(1.0, deadline - time.monotonic()))
            except (OSError, subprocess.SubprocessError):
                pass  # the folder goes with its owner; nothing more can be done
        self._running = []
        if self._own_base is not None:
            shutil.rmtree(self._own_base, ignore_errors=True)

    def _daemon_env(self, gpu: str) -> dict[str, str]:
        return {**os.environ, **self.environment(gpu), "CUDA_VISIBLE_DEVICES": gpu}

    def _log_tail(self, gpu: str) -> str:
        log = pathlib.Path(self.environment(gpu)["CUDA_MPS_LOG_DIRECTORY"]) / "control.log"
        try:
            lines = log.read_text(errors="replace").strip().splitlines()[-5:]
        except OSError:
            return ""
        return f" (last lines of {log}: " + " | ".join(lines) + ")" if lines else ""


def _uuid(token: str, physical: Sequence[tuple[str, str]]) -> str:
    """The UUID of the GPU ``token`` (an index or a UUID prefix) names, else ``token``."""
    if token.isdigit() and int(token) < len(physical):
        return physical[int(token)][1]
    position = gpu_listing.uuid_position(token, physical) if token.startswith("GPU-") else None
    return token if position is None else physical[position][1]


def configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment already points CUDA at an MPS server of the user's own."""
    return bool((os.environ if environ is None else environ).get("CUDA_MPS_PIPE_DIRECTORY"))
