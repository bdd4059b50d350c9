"""Start a module of this package as a process of its own: ``python -m jaxflowers.X``, and
end one without the interpreter's teardown.

The one way helper processes start: this interpreter, the package's folder first on
``PYTHONPATH``, so an uninstalled source checkout works too.
"""
from __future__ import annotations

import atexit
import os
import pathlib
import subprocess
import sys
import threading
from typing import Mapping

__all__ = ["PACKAGE_ROOT", "exit_without_teardown", "is_alive", "package_path",
           "restore_callers_environment", "start_module", "start_time"]

# The folder holding the ``jaxflowers`` package.
PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parents[2])
_CALLERS_SAFEPATH = "JAXFLOWERS_CALLERS_PYTHONSAFEPATH"  # what start_module replaced


def package_path(pythonpath: str | None) -> str:
    """``pythonpath`` (a PYTHONPATH value, or None) with ``PACKAGE_ROOT`` in front."""
    parts = [p for p in (pythonpath or "").split(os.pathsep) if p and p != PACKAGE_ROOT]
    return os.pathsep.join([PACKAGE_ROOT, *parts])


def start_module(module: str, *args: str, env: Mapping[str, str] | None = None,
                 **popen) -> subprocess.Popen:
    """``subprocess.Popen([python, "-m", module, *args], **popen)`` importing this jaxflowers,
    even from a folder that holds another (``-m`` would put the current folder first)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = package_path(env.get("PYTHONPATH"))
    env[_CALLERS_SAFEPATH] = env.get("PYTHONSAFEPATH", "")
    env["PYTHONSAFEPATH"] = "1"
    return subprocess.Popen([sys.executable, "-m", module, *args], env=env, **popen)


def restore_callers_environment() -> None:
    """In a module ``start_module`` started: give ``PYTHONSAFEPATH`` back its caller's value,
    so the Python processes a job starts find their scripts' folders as usual."""
    if _CALLERS_SAFEPATH in os.environ:
        callers = os.environ.pop(_CALLERS_SAFEPATH)
        if callers:
            os.environ["PYTHONSAFEPATH"] = callers
        else:
            os.environ.pop("PYTHONSAFEPATH", None)


def start_time(pid: int) -> str | None:
    """When process ``pid`` started, as the kernel counts it (``/proc/PID/stat``), or None
    where that cannot be read: with the pid, it names one process even after pid reuse."""
    try:
        with open(f"/proc/{int(pid)}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def is_alive(pid: int, started: str | None = None) -> bool:
    """Whether process ``pid`` exists on this machine and, when ``started`` is given (its
    ``start_time``), is still the process that started then."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process holds the pid
        pass
    now = start_time(pid)
    return started is None or now is None or now == started


def exit_without_teardown(status: int) -> None:
    """End the process with ``status`` as ``sys.exit`` does, minus the interpreter freeing
    every object of every module (about 0.5 s once JAX and matplotlib are loaded; a sweep's
    job is done only when its worker has exited). The ``atexit`` functions run and the
    standard streams are flushed first. While a non-daemon thread still runs, ``sys.exit``."""
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive()
           for t in threading.enumerate()):
        sys.exit(status)
    atexit._run_exitfuncs()  # noqa: SLF001 (what sys.exit would run; os._exit runs none)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or replaced by None
            pass
    os._exit(int(status or 0))
