"""One worker process: start it, read its progress, stop it, read what it left. Shared by
both backends, so both report crashes, exit codes and log tails alike."""
from __future__ import annotations

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Iterator, Mapping

from jaxflowers.host.processes import start_module
from jaxflowers.sweep import transfer
from jaxflowers.sweep.backends.worker import WAIT_FLAG
from jaxflowers.sweep.channel import ENV_FD, ENV_LAUNCHED
from jaxflowers.sweep.futures import JobError

__all__ = ["WorkerProcess", "log_tail", "outcome", "to_result", "write_spec"]

_log = logging.getLogger(__name__)


def write_spec(folder: pathlib.Path, reference: dict, arguments: Any, arrays: dict,
               sys_path: list[str] | None = None) -> None:
    """Store a job (reference, arguments, arrays, the caller's ``sys.path``) in ``folder``."""
    transfer.write_arguments(folder, arguments, arrays)
    sys_path = sys.path if sys_path is None else sys_path
    spec = {**reference, "sys_path": [p for p in sys_path if isinstance(p, str)]}
    (folder / "spec.json").write_text(json.dumps(spec))


class WorkerProcess:
    """The worker of the job in ``folder`` (``write_spec``), in its own session, output to
    ``log_path``. ``folder=None`` launches a warm worker: it imports JAX and the training
    code, then waits for ``assign`` to hand it a job (and the log its output then goes to)."""

    def __init__(self, folder: pathlib.Path | None, env: Mapping[str, str],
                 log_path: pathlib.Path):
        self.folder, self.log_path = folder, log_path
        read_fd, write_fd = os.pipe()
        env = {**env, ENV_FD: str(write_fd), ENV_LAUNCHED: repr(time.time())}
        try:
            with open(log_path, "wb") as log:
                self.proc = start_module(
                    "jaxflowers.sweep.backends.worker",
                    str(folder) if folder is not None else WAIT_FLAG, env=env,
                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(write_fd,), start_new_session=True)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the worker holds the only write end: EOF when it is gone
        self._pipe = os.fdopen(read_fd, "rb")
        self._reap_lock = threading.Lock()  # no signal to a reaped (reusable) pid
        self.returncode: int | None = None

    def assign(self, folder: pathlib.Path, log_path: pathlib.Path,
               environment: Mapping[str, str | None] | None = None) -> None:
        """Hand a warm worker its job, and ``environment``'s variables (None: unset) to take
        before the job runs; OSError if it is gone (launch another instead)."""
        message = {"folder": str(folder), "log": str(log_path), "assigned": time.time(),
                   "environment": dict(environment or {})}
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()
        self.folder, self.log_path = folder, log_path

    def discard(self) -> None:
        """Stop a warm worker that never got a job, and release its pipe."""
        self.kill()
        self.wait()
        self._pipe.close()

    def messages(self) -> Iterator[dict]:
        """The job's ``report`` messages, in order, until the worker closes the pipe."""
        with self._pipe:
            for line in self._pipe:
                try:
                    yield json.loads(line)
                except ValueError:
                    _log.warning("dropped a malformed progress line: %r", line[:200])

    def wait(self) -> int:
        """Wait for the exit, kill the rest of its group, reap; the exit status (< 0: a signal)."""
        if hasattr(os, "waitid"):  # wait without reaping, so the group id stays ours
            try:
                os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:  # already reaped
                pass
        with self._reap_lock:
            self._signal_group_unlocked(signal.SIGKILL)  # leftovers of the job (forked helpers...)
            self.returncode = self.proc.wait()
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:  # a job handed to a worker that had died: never read
                pass
        return self.returncode

    def running(self) -> bool:
        """Whether the worker has not exited yet (checked without reaping it)."""
        if self.returncode is not None:
            return False
        if not hasattr(os, "waitid"):
            return self.proc.poll() is None
        try:
            return os.waitid(os.P_PID, self.proc.pid,
                             os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False

    def terminate(self, grace: float = 1.0) -> None:
        """SIGTERM the worker's process group now and SIGKILL it after ``grace`` seconds."""
        self._signal_group(signal.SIGTERM)
        timer = threading.Timer(grace, self._signal_group, (signal.SIGKILL,))
        timer.daemon = True
        timer.start()

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, signum: int) -> None:
        with self._reap_lock:
            self._signal_group_unlocked(signum)

    def _signal_group_unlocked(self, signum: int) -> None:
        if self.returncode is None:  # once reaped, the pid may belong to someone else
            try:
                os.killpg(self.proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


def outcome(folder: pathlib.Path, returncode: int, log_path: pathlib.Path) -> dict:
    """What a finished worker left: ``{"status": "result", "json", "npz"}`` or
    ``{"status": "error", "reason", "exit_code", "signal_name", "log_tail", "error_type"}``."""
    if returncode == 0 and (folder / "result.json").exists():
        json_text, npz = transfer.read_result_files(folder)
        return {"status": "result", "json": json_text, "npz": npz}
    error = {"status": "error", "exit_code": returncode if returncode >= 0 else None,
             "signal_name": None, "log_tail": log_tail(log_path), "error_type": None}
    raised = folder / "error.json"
    if returncode == 1 and raised.exists():
        info = json.loads(raised.read_text())
        error.update(reason=f"raised {info['type']}: {info['message']}", error_type=info["type"])
    elif returncode < 0:
        name = _signal_name(-returncode)
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" \
            if name == "SIGKILL" else ""
        error.update(reason=f"was killed by {name}{hint}", signal_name=name)
    else:
        error["reason"] = (f"exited with code {returncode}" if returncode else
                           "exited without leaving a result")
    return error


def to_result(job_index: int, done: dict) -> tuple[Any, JobError | None]:
    """(value, None) or (None, JobError) from an ``outcome`` dict."""
    if done["status"] == "result":
        try:
            return transfer.read_result_bytes(done["json"], done["npz"]), None
        except Exception as error:  # noqa: BLE001
            return None, JobError(job_index, f"left a result that could not be read: {error}")
    fields = {k: done[k] for k in ("exit_code", "signal_name", "log_tail", "error_type")}
    return None, JobError(job_index, done["reason"], **fields)


def log_tail(path: pathlib.Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ("" if it is missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
