"""Kill every sweep job when the caller stops: Ctrl-C, SIGTERM or interpreter exit.

Workers run in their own sessions, so Ctrl-C reaches only the caller, which kills them. The
handlers live while a pool is open, chain to the previous ones and give them back after.
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref

__all__ = ["register", "terminate_all", "unregister"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Open pools of this process and the handlers we replaced. Process-wide by nature: signal
# handlers and atexit are process-wide too.
_state = {"pools": weakref.WeakSet(), "previous": {}, "atexit": False}
_lock = threading.Lock()


def register(pool) -> None:
    """Kill ``pool``'s jobs (``pool.terminate()``) on SIGINT, SIGTERM and at exit."""
    with _lock:
        _state["pools"].add(pool)
        if not _state["atexit"]:
            atexit.register(terminate_all)
            _state["atexit"] = True
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                _install(signum)


def unregister(pool) -> None:
    """Forget a closed pool; restore the previous handlers when it was the last one."""
    with _lock:
        _state["pools"].discard(pool)
        if len(_state["pools"]) or threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in list(_state["previous"].items()):
            if signal.getsignal(signum) is _handle:
                signal.signal(signum, previous)
            del _state["previous"][signum]


def _install(signum: int) -> None:
    current = signal.getsignal(signum)
    if current is _handle or current in (signal.SIG_IGN, None):
        return  # already ours, or the caller chose to ignore this signal
    _state["previous"][signum] = current
    signal.signal(signum, _handle)


def terminate_all() -> None:
    """Kill the jobs of every open pool (SIGTERM, then SIGKILL after about a second)."""
    for pool in list(_state["pools"]):
        pool.terminate()


def _handle(signum, frame) -> None:
    previous = _state["previous"].get(signum, signal.SIG_DFL)  # before terminate forgets it
    terminate_all()
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:  # die of the same signal, as the default would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
