"""``report``: a job's progress to its pool (MATLAB: ``send`` to a DataQueue), as JSON lines on
a pipe of their own; outside a pool it does nothing, so a job function runs unchanged.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Mapping

__all__ = ["ENV_FD", "ENV_LAUNCHED", "ENV_READY", "ENV_WARM_SINCE", "connect",
           "encode_message", "launched", "mark", "marks", "print_times", "ready", "report",
           "warm_since"]

ENV_FD = "JAXFLOWERS_SWEEP_REPORT_FD"
ENV_LAUNCHED = "JAXFLOWERS_SWEEP_LAUNCHED"  # time.time() when the worker got its job
ENV_READY = "JAXFLOWERS_SWEEP_READY"  # time.time() when a warm worker had imported JAX
ENV_WARM_SINCE = "JAXFLOWERS_SWEEP_WARM_SINCE"  # time.time() when a warm worker was launched
# The one pipe of this worker process; set by ``connect`` in the worker, None elsewhere.
_channel: dict[str, Any] = {"fd": None, "lock": threading.Lock()}


def report(message: Mapping[str, Any]) -> None:
    """Send a progress message to the pool's ``after_each`` callbacks (MATLAB: ``send``).

    Args:
      message: str keys and JSON-able values (numpy/JAX scalars and small arrays are converted).
    """
    fd = _channel["fd"]
    if fd is None:
        return
    line = (encode_message(message) + "\n").encode()
    with _channel["lock"]:  # one line at a time, even from several job threads
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]


def encode_message(message: Mapping[str, Any]) -> str:
    """``message`` as one JSON line; TypeError names what does not convert."""
    if not isinstance(message, Mapping):
        raise TypeError(f"report() takes a dict, not {type(message).__name__}")
    return json.dumps(dict(message), default=_to_json, separators=(",", ":"))


def _to_json(value: Any) -> Any:
    if hasattr(value, "__array__") or hasattr(value, "item"):
        import numpy as np

        array = np.asarray(value)
        if not array.dtype.hasobject:
            return array.tolist()
    raise TypeError(f"report(): {type(value).__name__} {value!r:.60} is not JSON-able")


def connect(environ: dict[str, str] | None = None) -> bool:
    """Open this worker's channel from ``$JAXFLOWERS_SWEEP_REPORT_FD``; whether there is one."""
    environ = os.environ if environ is None else environ
    fd = environ.pop(ENV_FD, None)  # popped: the job's subprocesses must not inherit it
    _channel["fd"] = int(fd) if fd else None
    for key, name in (("launched", ENV_LAUNCHED), ("ready", ENV_READY),
                      ("warm_since", ENV_WARM_SINCE)):
        try:
            _channel[key] = float(environ.pop(name))
        except (KeyError, ValueError):
            _channel[key] = None
    return _channel["fd"] is not None


def launched() -> float | None:
    """``time.time()`` when this worker got its job (its launch, or the hand-over to a warm
    worker); None outside a pool."""
    return _channel.get("launched")


def mark(name: str) -> None:
    """Note when ``name`` happened, in seconds after this worker got its job (the last call
    for a name wins); nothing outside a pool. The worker prints them once the job ends."""
    if _channel.get("launched") is not None:
        _channel.setdefault("marks", {})[name] = time.time() - _channel["launched"]


def marks() -> dict[str, float]:
    """The ``mark`` times so far, in the order the names were first marked."""
    return dict(_channel.get("marks", {}))


def print_times(what: str, times: Mapping[str, float]) -> None:
    """One log line: ``what``, then each of ``times`` (seconds after the job reached its
    worker), the form ``benchmarks/end_to_end.py`` reads."""
    print(f"{what}, seconds after the job reached its worker: "
          + ", ".join(f"{name} {seconds:.1f}" for name, seconds in times.items()), flush=True)


def ready() -> float | None:
    """``time.time()`` when this warm worker had imported JAX and the training code; None if
    the worker was launched with its job, or outside a pool."""
    return _channel.get("ready")


def warm_since() -> float | None:
    """``time.time()`` when this warm worker was launched, before its job came; None if the
    worker was launched with its job, or outside a pool."""
    return _channel.get("warm_since")
