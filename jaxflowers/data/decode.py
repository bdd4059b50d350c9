"""Decode a resize cache's rows: in threads, or in worker processes (many local files).

Each worker process writes its own run of rows into the half-built file (``os.pwrite``); only
names and row counts cross the pipes (JSON). Workers are ``python -m`` subprocesses: ``fork``
is unsafe with threads, and ``spawn`` re-runs an unguarded ``__main__`` (it would wait on its
parent's lock).
"""
from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from typing import Callable, Iterator, Sequence

from jaxflowers.data.imread import decode_rows, failure_reason, read_error
from jaxflowers.host.processes import start_module

__all__ = ["PROCESS_MIN_CPUS", "PROCESS_MIN_FILES", "available_cpus", "decode_in_processes",
           "decode_in_threads", "decode_into", "default_processes", "default_workers", "main",
           "use_processes"]

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


def default_workers() -> int:
    """Threads that read and decode: ``min(32, cpu_count + 4)``, as ``ThreadPoolExecutor``."""
    return min(32, (os.cpu_count() or 1) + 4)


def decode_into(path: str, offset: int, files: Sequence[str], shape: tuple[int, ...], *,
                read: Callable[[str], bytes], workers: int | None, on_error: str,
                processes: bool | None) -> dict[int, str]:
    """Decode every file into its row of the allocated ``.npy`` file ``path`` (data at
    ``offset``, (N, H, W, 3) ``shape``) and flush it to disk.

    Args:
      read: returns an entry of ``files``' bytes, for threads (processes read local paths).
      workers: threads or processes; None: ``default_workers()`` or ``default_processes()``.
      on_error: ``"raise"`` (the first failure) or ``"skip"``.
      processes: decode in processes, threads (False), or None: ``use_processes`` decides.

    Returns:
      ``{row: "ErrorType: message"}`` of the files that failed.
    """
    desc = f"Resizing {len(files)} images to {shape[1]}x{shape[2]}"
    if processes is None:  # processes: decoding small images is Python holding the GIL
        processes = use_processes(len(files))
    fd = os.open(path, os.O_WRONLY)
    try:
        if processes:
            failed = decode_in_processes(path, offset, files, shape,
                                         processes=workers or default_processes(),
                                         on_error=on_error, desc=desc)
        else:
            failed = decode_in_threads(fd, offset, files, read, shape,
                                       workers=workers or default_workers(), on_error=on_error,
                                       desc=desc)
        os.fsync(fd)  # flushes the file's pages, whichever process wrote them
    finally:
        os.close(fd)
    return failed


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


def decode_in_threads(fd: int, offset: int, files: Sequence[str],
                      read: Callable[[str], bytes], shape: tuple[int, ...], *, workers: int,
                      on_error: str, desc: str) -> dict[int, str]:
    """Decode ``files`` (each read by ``read``) into their rows of the open ``.npy`` file
    ``fd`` in ``workers`` threads; as :func:`decode_in_processes` otherwise."""
    # Tasks of several rows: one future per tiny image (CIFAR) costs more than decoding it.
    step = max(1, min(32, len(files) // (8 * workers)))
    pool = concurrent.futures.ThreadPoolExecutor(workers)
    try:
        work = functools.partial(decode_rows, fd, offset, files, read, shape)
        chunks = [range(i, min(i + step, len(files))) for i in range(0, len(files), step)]
        futures = {pool.submit(work, rows): rows for rows in chunks}
        return _collect(futures, files, on_error, desc)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # before the caller closes fd


def _collect(futures: dict, files: Sequence[str], on_error: str, desc: str) -> dict[int, str]:
    """Wait for ``futures`` ({future: its rows}) under a progress bar; ``{row: reason}``."""
    from jaxflowers.host.terminal import progress_bar

    failed: dict[int, str] = {}
    with progress_bar(len(files), desc=desc, unit="img", log_when_done=True) as bar:
        for future in concurrent.futures.as_completed(futures):
            for row, exc in sorted(future.result().items()):
                failed[row] = failure_reason(exc)
                if on_error == "raise":
                    raise read_error(files[row], failed[row]) from exc
            bar.update(len(futures[future]))
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
