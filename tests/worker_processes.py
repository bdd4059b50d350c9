"""Sweep worker processes as the tests see them: which are alive, and waiting for them to
show or to go."""
from __future__ import annotations

import time

import psutil


def sweep_workers() -> list[psutil.Process]:
    """Sweep worker processes (local or under Ray) that descend from this process."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "jaxflowers.sweep.backends.worker" in " ".join(proc.cmdline()) and alive(proc.pid):
                found.append(proc)
        except psutil.Error:
            pass
    return found


def sweep_workers_soon(count: int, seconds: float = 30) -> list[psutil.Process]:
    """``sweep_workers()`` once ``count`` of them show, waiting up to ``seconds``: a process
    just launched shows its own command line only once it has exec'd, later on a loaded
    machine."""
    deadline = time.monotonic() + seconds
    while len(found := sweep_workers()) != count and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(found) == count, [p.as_dict(["pid", "status", "cmdline"]) for p in
                                 psutil.Process().children(recursive=True)]
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
