"""The sweep's worker process: ``python -m jaxflowers.sweep.backends.worker FOLDER|--wait``.

It runs the job in FOLDER (``spec.json``, arguments) and leaves ``result.json``/``.npz`` (exit
0) or ``error.json`` (exit 1) there; progress goes to ``$JAXFLOWERS_SWEEP_REPORT_FD``, prints
to the job's log. It dies with its parent: EOF on stdin, whose other end the parent holds.
With ``--wait`` it is a warm worker: it imports JAX and the training code first, then reads
its job from stdin as one JSON line (``{"folder", "log", "assigned"}``); EOF at any time
kills it as it kills a job.
"""
from __future__ import annotations

import json
import os
import pathlib
import queue
import signal
import sys
import threading
import time
import traceback

__all__ = ["WAIT_FLAG", "main", "run"]

WAIT_FLAG = "--wait"
# What a warm worker imports before its job comes: what a training job needs (seconds).
PRELOAD = ("jax", "jaxflowers.training.run", "jaxflowers.inference.predict",
           "jaxflowers.sweep.jobs")


def _watch_parent(jobs: queue.SimpleQueue | None = None) -> None:
    """Kill this worker's process group (the job and its children) on EOF on stdin; a warm
    worker's first line on stdin is its job, put into ``jobs``."""
    # not PR_SET_PDEATHSIG: it fires when the spawning *thread* ends, and the pool spawns from
    # short-lived threads
    line = b""
    try:  # raw reads: a daemon thread inside a buffered reader aborts interpreter exit
        while chunk := os.read(0, 4096):
            if jobs is not None and b"\n" not in line:
                line += chunk
                if b"\n" in line:
                    jobs.put(line.split(b"\n", 1)[0])
    except OSError:
        pass
    finally:
        if os.getpgrp() == os.getpid():  # we lead our own session (start_new_session=True)
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def run(folder: pathlib.Path) -> int:
    """Run the job stored in ``folder``; returns the exit status (0 done, 1 raised)."""
    from jaxflowers.sweep import channel, transfer

    spec = json.loads((folder / "spec.json").read_text())
    sys.path[:0] = [p for p in spec["sys_path"] if p not in sys.path]
    channel.connect()
    try:
        fn = transfer.resolve_job(spec["ref"], spec.get("main_path"))
        args = transfer.rebuild(transfer.read_arguments(folder))
        transfer.write_result(folder, fn(*args["args"], **args["kwargs"]))
        channel.mark("result written")
        if times := channel.marks():  # where the job's end went (start-up: sweep.jobs)
            channel.print_times("End", times)
        return 0
    except Exception as error:  # noqa: BLE001 (every failure is reported to the caller)
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        (folder / "error.json").write_text(json.dumps(
            {"type": type(error).__name__, "message": str(error), "traceback": text}))
        return 1


def _wait_for_job(jobs: queue.SimpleQueue) -> pathlib.Path:
    """A warm worker's start: import ``PRELOAD``, take the job from ``jobs`` (the parent's
    line, ``_watch_parent``), send the output to the job's log."""
    import importlib

    from jaxflowers.sweep.channel import ENV_LAUNCHED, ENV_READY, ENV_WARM_SINCE

    for module in PRELOAD:
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 (the job imports it again and reports)
            print(f"warm worker: importing {module} failed: {error}", file=sys.stderr)
    os.environ[ENV_READY] = repr(time.time())
    job = json.loads(jobs.get())
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ[ENV_WARM_SINCE] = os.environ.get(ENV_LAUNCHED, "")  # this process's launch
    os.environ[ENV_LAUNCHED] = repr(job["assigned"])  # start-up counts from the hand-over
    for name, value in job.get("environment", {}).items():  # the slot's, read by JAX later
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return pathlib.Path(job["folder"])


def main(argv: list[str] | None = None) -> int:
    from jaxflowers.host.processes import restore_callers_environment

    restore_callers_environment()  # a job's own Python processes start as the caller's would
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m jaxflowers.sweep.backends.worker FOLDER|{WAIT_FLAG}",
              file=sys.stderr)
        return 2
    jobs = queue.SimpleQueue() if argv[0] == WAIT_FLAG else None
    # from the start: a warm worker whose pool is gone dies at once, even while it imports
    threading.Thread(target=_watch_parent, args=(jobs,), name="watch-parent",
                     daemon=True).start()
    folder = pathlib.Path(argv[0]) if jobs is None else _wait_for_job(jobs)
    status = run(folder)
    sys.stdout.flush()
    sys.stderr.flush()
    return status


if __name__ == "__main__":
    from jaxflowers.host.processes import exit_without_teardown

    exit_without_teardown(main())  # the job is done when its worker has exited
