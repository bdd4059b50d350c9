"""Job functions for the sweep tests: workers import them by reference ("module:name"),
so they live in an importable module of their own."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np

from jaxflowers.sweep import report


def add(a, b):
    """a + b, after reporting three messages numbered 0, 1, 2."""
    for i in range(3):
        report({"i": i, "value": np.float32(i / 2)})  # numpy scalars must travel too
    return a + b


def interval(seconds: float):
    """(worker creation time, start time, end time) of a job that sleeps ``seconds``."""
    import psutil

    start = time.time()
    time.sleep(seconds)
    return psutil.Process().create_time(), start, time.time()


def announce_and_sleep(seconds: float, with_child: bool = False):
    """Report this worker's pid (and a grandchild's, if asked), then sleep."""
    message = {"pid": os.getpid()}
    if with_child:
        message["child"] = subprocess.Popen([sys.executable, "-c", "import time; "
                                             "time.sleep(120)"]).pid
    report(message)
    print("sleeping", flush=True)
    time.sleep(seconds)
    return seconds


def environment():
    """The environment variables a pool sets for its workers."""
    names = ("CUDA_VISIBLE_DEVICES", "JAX_PLATFORMS", "XLA_PYTHON_CLIENT_MEM_FRACTION",
             "XLA_PYTHON_CLIENT_PREALLOCATE", "NCCL_NVLS_ENABLE")
    return {name: os.environ.get(name) for name in names}


def arrays(x, *, scale):
    """Facts about the array argument, and two arrays back as a tuple of outputs."""
    facts = {"memmap": isinstance(x, np.memmap), "writeable": bool(x.flags.writeable),
             "dtype": str(x.dtype), "shape": list(x.shape)}
    return facts, (np.asarray(x) * scale).astype(x.dtype), np.arange(3, dtype=np.int16)


def with_jax():
    """Platform and a JAX array, to check JAX runs in a CPU worker and its arrays return."""
    import jax
    import jax.numpy as jnp

    return jax.devices()[0].platform, jnp.arange(4.0) * 2


def fail(kind: str):
    """Fail in the way ``kind`` names, after a recognisable line in the log."""
    print(f"about to fail: {kind}", flush=True)
    if kind == "raise":
        raise ValueError("the job raised on purpose")
    if kind == "exit":
        os._exit(3)
    if kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "oom-killed":  # what the kernel's OOM killer does
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "memory":  # an allocation beyond the address-space limit
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        used = _virtual_memory_bytes()
        resource.setrlimit(resource.RLIMIT_AS, (used + (256 << 20), hard))
        return bytearray(1 << 30)
    raise AssertionError(f"unknown failure kind {kind!r}")


def _virtual_memory_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def node_module():
    """``node_only.VALUE`` (a module only the node's own PYTHONPATH holds) and that path."""
    import node_only

    return node_only.VALUE, os.environ.get("PYTHONPATH", "")


def report_states(*states: str):
    """Report one message per state, then one of the job's own without a state."""
    for state in states:
        report({"state": state, "iteration": 1})
    report({"mine": True})
    return len(states)


def environment_of(*names):
    """The worker's values of the environment variables ``names``."""
    return {name: os.environ.get(name) for name in names}


def report_memory_then_sleep(peak: int, limit: int, seconds: float):
    """Report a device footprint as train_job's first iteration does; (fraction, start, end)."""
    import time

    from jaxflowers.sweep import report

    start = time.time()
    report({"state": "iteration", "iteration": 1,
            "device_memory": {"peak": peak, "limit": limit}})
    time.sleep(seconds)
    return os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"), start, time.time()


def report_memory_warm_then_sleep(peak: int, limit: int, seconds: float, wait: float = 0.0):
    """``report_memory_then_sleep``'s (fraction, start, end) after ``wait`` seconds, and whether
    a warm worker ran it."""
    from jaxflowers.sweep.channel import ready

    time.sleep(wait)
    return (*report_memory_then_sleep(peak, limit, seconds), ready() is not None)


def placed(seconds: float):
    """(the CPU devices and GPUs this worker was given, start time, end time) of a job that
    sleeps ``seconds``."""
    start = time.time()
    time.sleep(seconds)
    devices = os.environ.get("JAX_NUM_CPU_DEVICES"), os.environ.get("CUDA_VISIBLE_DEVICES")
    return devices, start, time.time()


def worker_facts():
    """This worker's pid and whether JAX was imported before the job began (what a warm
    worker does while it waits) and when it was ready, relative to its job's hand-over
    (``channel.ready``) and to its own launch (``channel.warm_since``); prints a line to the
    job's log."""
    from jaxflowers.sweep import channel

    ready, since = channel.ready(), channel.warm_since()
    facts = {"pid": os.getpid(), "jax_preloaded": "jax" in sys.modules,
             "ready_before_job": None if ready is None else ready <= channel.launched(),
             "launched_before_ready": None if since is None else since <= ready}
    print(f"worker facts: {facts}", flush=True)
    return facts


def run_script_beside_its_module(folder: str):
    """Run a Python script that imports a module beside it, as a job's own helper might;
    (its exit status and output, this worker's PYTHONSAFEPATH)."""
    import pathlib
    import subprocess

    folder = pathlib.Path(folder)
    (folder / "beside.py").write_text("WORD = 'found'\n")
    (folder / "script.py").write_text("import beside\nprint(beside.WORD)\n")
    done = subprocess.run([sys.executable, str(folder / "script.py")], capture_output=True,
                          text=True, timeout=60)
    return done.returncode, done.stdout.strip(), os.environ.get("PYTHONSAFEPATH")
