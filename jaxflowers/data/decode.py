"""Build a resize cache in worker processes: the process side of :mod:`jaxflowers.data.cache`.

Each worker writes its own run of rows into the half-built file (``os.pwrite``); only names and
row counts cross the pipes (JSON). Workers are ``python -m`` subprocesses: ``fork`` is unsafe
with threads, and ``spawn`` re-runs an unguarded ``__main__`` (it would wait on its parent's lock).
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from typing import Iterator, Sequence

from jaxflowers.data.imread import decode_rows, failure_reason, read_error
from jaxflowers.host.processes import start_module

__all__ = ["PROCESS_MIN_CPUS", "PROCESS_MIN_FILES", "available_cpus", "decode_in_processes",
           "default_processes", "main", "use_processes"]

# Fewer files: starting the workers costs about what they save.
PROCESS_MIN_FILES = 2_000
# Fewer CPUs: threads, so small machines (CI, a laptop) never pay the start-up.
PROCESS_MIN_CPUS = 3
_BATCH = 32  # rows between two progress messages of a worker
_MODULE = "jaxflowers.data.decode"


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def default_processes() -> int:
    """Decode processes of a build: one per available CPU, at most 32."""
    return min(32, available_cpus())


def use_processes(num_files: int) -> bool:
    """Whether ``num_files`` local files are worth decoding in processes on this machine."""
    return num_files >= PROCESS_MIN_FILES and available_cpus() >= PROCESS_MIN_CPUS


def decode_in_processes(path: str, offset: int, files: Sequence[str], shape: tuple[int, ...],
                        *, processes: int, on_error: str, desc: str) -> dict[int, str]:
    """Decode local ``files`` into their rows of the ``.npy`` file ``path`` in processes.

    ``path`` is full size, its data at ``offset``; ``shape`` is (N, H, W, 3); at most N processes
    start. Returns ``{row: "ErrorType: message"}``; with ``on_error="raise"`` the first raises.
    """
    from jaxflowers.host.terminal import progress_bar

    count = min(processes, len(files))
    bounds = [len(files) * i // count for i in range(count + 1)] if count else [0]
    runs = list(zip(bounds[:-1], bounds[1:]))
    workers: list[_Worker] = []
    failed: dict[int, str] = {}
    inbox: queue.Queue = queue.Queue()
    try:
        for _ in runs:  # all started before any is fed, so they boot side by side
            workers.append(_Worker(inbox))
        for worker, (lo, hi) in zip(workers, runs):
            worker.feed({"path": path, "offset": offset, "shape": list(shape), "first": lo,
                         "files": list(files[lo:hi]), "stop_at_error": on_error == "raise"})
        with progress_bar(len(files), desc=f"{desc} in {count} processes",
                          unit="img", log_when_done=True) as bar:
            for worker, message in _messages(inbox, len(workers)):
                for row, reason in message["failed"]:
                    failed[row] = reason
                    if on_error == "raise":
                        raise read_error(files[row], reason)
                worker.rows += message["done"]
                bar.update(message["done"])
        for worker, (lo, hi) in zip(workers, runs):
            worker.check(hi - lo)
    finally:
        for worker in workers:
            worker.stop()
    return failed


class _Worker:
    """One worker process; a thread puts ``(worker, message)`` in ``inbox``, None at the end."""

    def __init__(self, inbox: queue.Queue):
        self.rows = 0  # rows the worker reported done (decoded or failed)
        self.log = tempfile.TemporaryFile()
        self.proc = start_module(_MODULE, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=self.log)
        threading.Thread(target=self._pump, args=(inbox,), daemon=True).start()

    def feed(self, job: dict) -> None:
        """Send the job and close stdin; a worker that died already is reported by check."""
        try:
            self.proc.stdin.write(json.dumps(job).encode())  # ASCII: odd bytes travel as \udcXX
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def check(self, expected: int) -> None:
        """Raise unless the worker exited 0 after ``expected`` rows; pass on its stderr."""
        returncode = self.proc.wait()
        self.log.seek(0)
        text = self.log.read().decode("utf-8", errors="replace")
        if returncode != 0 or self.rows != expected:
            raise RuntimeError(f"resize cache: decode process {self.proc.pid} exited with "
                               f"status {returncode} after {self.rows} of its {expected} "
                               f"images; its stderr ends:\n{text[-2000:]}")
        if text:
            sys.stderr.write(text)

    def _pump(self, inbox: queue.Queue) -> None:
        try:
            for line in self.proc.stdout:
                try:
                    inbox.put((self, json.loads(line)))
                except ValueError:  # not ours; the row count check catches anything lost
                    pass
        except (OSError, ValueError):  # stdout closed by stop() after an error elsewhere
            pass
        finally:
            inbox.put((self, None))

    def stop(self) -> None:
        """Kill the worker if it still runs (an error elsewhere, Ctrl-C) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.log):
            try:
                stream.close()
            except OSError:  # stdin's unflushed bytes after a BrokenPipeError
                pass


def _messages(inbox: queue.Queue, running: int) -> Iterator[tuple[_Worker, dict]]:
    while running:
        worker, message = inbox.get()
        if message is None:
            running -= 1
        else:
            yield worker, message


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def main() -> None:
    """The worker: decode the rows named by the job on stdin, report on stdout."""
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a stray print() from a library must not garble the messages
    job = json.load(sys.stdin)
    first, shape = job["first"], tuple(job["shape"])
    files = dict(enumerate(job["files"], first))  # files[row], as decode_rows indexes them
    end = first + len(files)
    fd = os.open(job["path"], os.O_WRONLY)
    try:
        for lo in range(first, end, _BATCH):
            rows = range(lo, min(lo + _BATCH, end))
            failed = decode_rows(fd, job["offset"], files, _read, shape, rows)
            reasons = [[row, failure_reason(exc)] for row, exc in sorted(failed.items())]
            channel.write(json.dumps({"done": len(rows), "failed": reasons}) + "\n")
            channel.flush()  # a dead parent: BrokenPipeError here ends the worker
            if failed and job["stop_at_error"]:
                return
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()
