"""Resize once (MATLAB's ``transform`` + ``writeall``): a folder into one uint8 ``.npy`` memmap.

The key digests the file list with fingerprints, the size and the resize method. A build holds
``flock`` on ``<stem>.lock`` and lands by ``os.replace``; the sidecar ``<stem>.json`` holds an
xxh3-128 digest checked on every open (a mismatch rebuilds). Memory stays flat (``os.pwrite``).
Each row's channel sums are stored too (``<stem>.moments.npy``), so the statistics of a set
streamed from the cache need no pass over its images.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import glob
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import tempfile
import warnings
from typing import Callable, NamedTuple, Sequence

import numpy as np

from jaxflowers.data import decode
from jaxflowers.data.imread import decode_rows, failure_reason, read_error
from jaxflowers.data.mapped import take_rows
from jaxflowers.data.moments import row_moments
from jaxflowers.host.files import unwritable, write_json_atomic

__all__ = ["FORMAT_VERSION", "ON_ERROR", "RESIZE_METHOD", "ResizeCache", "cache_key",
           "default_cache_dir", "default_workers", "file_digest", "file_stamp", "open_or_build",
           "reopen"]

RESIZE_METHOD = "pil-lanczos"  # recorded in the key and the sidecar; change it if decoding changes
FORMAT_VERSION = 2  # 2: xxh3 digests, the folder's origin in the sidecar
ON_ERROR = ("raise", "skip")


@dataclasses.dataclass(frozen=True)
class ResizeCache:
    """An opened resize cache.

    Attributes:
      path: the ``.npy`` file.
      images: read-only memmap, uint8 (N, H, W, 3), one row per file in list order.
      failed: ``{row: reason}`` of undecodable files (rows left zero; never hand them out).
      stamp: ``file_stamp`` of the file when its digest was checked ("" for a cache deleted
        once loaded): another process may ``reopen`` it unchecked while the stamp holds.
      moments: int64 (N, 2, 3), each row's per-channel pixel sum and sum of squares, stored
        beside the images when the cache was built (``<stem>.moments.npy``, its digest in the
        sidecar); None where they are missing or do not match, and in a cache reopened
        from a listing (its check is the file's stamp alone).
    """

    path: str
    images: np.ndarray
    failed: dict[int, str]
    stamp: str = ""
    moments: np.ndarray | None = None

    def take(self, rows: np.ndarray) -> np.ndarray:
        """uint8 (len(rows), H, W, 3), read-only: a memmap slice if contiguous, else a copy."""
        if rows.size and np.array_equal(rows, np.arange(rows[0], rows[0] + rows.size)):
            return self.images[rows[0]:rows[0] + rows.size]
        out = take_rows(self.images, rows)
        out.flags.writeable = False
        return out


def default_workers() -> int:
    """Threads that read and decode: ``min(32, cpu_count + 4)``, as ``ThreadPoolExecutor``."""
    return min(32, (os.cpu_count() or 1) + 4)


def default_cache_dir() -> str:
    """``$JAXFLOWERS_CACHE_DIR`` if set, else ``~/.cache/jaxflowers``."""
    return os.path.expanduser(os.environ.get("JAXFLOWERS_CACHE_DIR") or "~/.cache/jaxflowers")


def cache_key(files: Sequence[str], fingerprints: Sequence[str],
              image_size: tuple[int, int]) -> str:
    """Hex digest naming the cache of ``files`` (with their fingerprints) at ``image_size``."""
    blob = json.dumps({"format": FORMAT_VERSION, "method": RESIZE_METHOD,
                       "size": list(image_size), "files": list(zip(files, fingerprints))})
    return hashlib.sha256(blob.encode()).hexdigest()


def file_digest(path: str) -> str:
    """Hex xxh3-128 of a file's bytes, read in chunks."""
    import xxhash

    digest = xxhash.xxh3_128()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def file_stamp(st: os.stat_result) -> str:
    """Size, modification and change times and inode of a file: any rewrite changes one
    (``cp -p``, tar and ``rsync -a`` keep size and mtime, not the inode or ctime)."""
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}"


def reopen(path: str, stamp: str, shape: Sequence[int],
           failed: dict[int, str]) -> ResizeCache | None:
    """The cache at ``path`` that a process checked when the file had ``stamp``, without
    reading its digest again; None if the file has changed since (or is not the shape)."""
    try:
        if not stamp or file_stamp(os.stat(path)) != stamp:
            return None
        images = np.load(path, mmap_mode="r")
        if file_stamp(os.stat(path)) != stamp:  # replaced while it was being mapped
            return None
    except (OSError, ValueError):
        return None
    if images.shape != tuple(shape) or images.dtype != np.uint8:
        return None
    return ResizeCache(path, images, dict(failed), stamp)


def open_or_build(files: Sequence[str], fingerprints: Sequence[str],
                  read: Callable[[str], bytes], *, image_size: tuple[int, int],
                  cache_dir: str | os.PathLike | None = None, name: str = "images",
                  workers: int | None = None, on_error: str = "raise",
                  processes: bool | None = False, origin: str | None = None) -> ResizeCache:
    """The uint8 (N, height, width, 3) :class:`ResizeCache` of ``files``: opened, or built once.

    Args:
      files, fingerprints: N paths or URLs in row order, and N strings that change with a file.
      read: returns the bytes of one entry of ``files``; called from worker threads.
      image_size, cache_dir, workers, on_error: as ``ImageFolder``'s.
      name: readable prefix of the cache's file names.
      processes: decode in processes (reading local paths), threads (False), or None: decide.
      origin: the folder or URL; a new cache of it removes its older ones at the same size.
    """
    cache_dir = os.path.abspath(os.fspath(cache_dir or default_cache_dir()))
    key = cache_key(files, fingerprints, image_size)
    base = f"{_slug(name)}-{image_size[0]}x{image_size[1]}-{key[:16]}"
    stem, shape = os.path.join(cache_dir, base), (len(files), *image_size, 3)
    how = _Decoding(read, workers, on_error, processes, origin)
    cache, _ = _open_valid(stem, key, shape)  # a read-only folder may hold a valid cache
    if cache is None:
        problem = unwritable(cache_dir)
        if problem:
            warnings.warn(f"resize cache folder {cache_dir} cannot be written ({problem}); "
                          "going on without the cache: the images are decoded into a "
                          "temporary file, deleted once loaded", stacklevel=2)
            cache = _build_unkept(base, key, files, shape, how)
        else:
            cache = _build_kept(stem, key, files, shape, how)
    if on_error == "raise" and cache.failed:
        row, reason = min(cache.failed.items())
        raise read_error(files[row], f"{reason} (recorded in {cache.path})")
    return cache


def _build_kept(stem: str, key: str, files: Sequence[str], shape: tuple[int, ...],
                how: _Decoding) -> ResizeCache:
    """Build the cache at ``stem`` under its lock, unless another process built it meanwhile."""
    with _locked(stem + ".lock"):
        cache, problem = _open_valid(stem, key, shape)
        if cache is None:
            if problem:
                warnings.warn(f"resize cache {stem}.npy is invalid ({problem}); rebuilding it",
                              stacklevel=3)
            cache = _build(stem, key, files, shape, how)
    return cache


def _build_unkept(base: str, key: str, files: Sequence[str], shape: tuple[int, ...],
                  how: _Decoding) -> ResizeCache:
    """Build in a temporary folder deleted at once; the memmap keeps the pages (POSIX)."""
    folder = tempfile.mkdtemp(prefix="jaxflowers-resize-")
    try:
        return _build(os.path.join(folder, base), key, files, shape, how)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class _Decoding(NamedTuple):
    read: Callable[[str], bytes]  # used by threads; processes read local files themselves
    workers: int | None  # threads or processes; None: the default of the kind
    on_error: str
    processes: bool | None  # None: decided by decode.use_processes
    origin: str | None  # recorded in the sidecar: whose caches a new one replaces


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")[:40] or "images"


@contextlib.contextmanager
def _locked(path: str):
    """Hold an exclusive ``flock`` on ``path`` (created if missing; never deleted)."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock, but os.replace still keeps every cache whole
        yield
        return
    with open(path, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _open_valid(stem: str, key: str, shape: tuple[int, ...]) -> tuple[ResizeCache | None, str]:
    """(cache, "") if ``stem`` holds a valid cache for ``key``; else (None, problem or "")."""
    npy, meta = stem + ".npy", stem + ".json"
    if not os.path.exists(npy) and not os.path.exists(meta):
        return None, ""
    try:
        with open(meta, encoding="utf-8") as f:
            info = json.load(f)
        images = np.load(npy, mmap_mode="r")
    except (OSError, ValueError) as exc:
        return None, f"unreadable: {exc}"
    if (info.get("format"), info.get("key"), tuple(info.get("shape", ()))) != (
            FORMAT_VERSION, key, shape) or images.shape != shape or images.dtype != np.uint8:
        return None, f"header or shape {images.shape} {images.dtype} does not match {shape}"
    try:
        stamp = file_stamp(os.stat(npy))  # before the digest: a later change alters it
    except OSError as exc:
        return None, f"unreadable: {exc}"
    if file_digest(npy) != info.get("xxh3"):
        return None, "the file's digest does not match its sidecar; the file changed on disk"
    failed = {int(k): v for k, v in info.get("failed", {}).items()}
    return ResizeCache(npy, images, failed, stamp, _load_moments(stem, info, shape[0])), ""


def _load_moments(stem: str, info: dict, rows: int) -> np.ndarray | None:
    """The rows' moments stored at ``stem.moments.npy`` if the sidecar ``info`` names their
    digest and it matches (read into memory); else None, and the statistics are summed from
    the images."""
    path = stem + ".moments.npy"
    expected = info.get("moments_xxh3")
    if not expected or not os.path.exists(path):
        return None
    try:
        if file_digest(path) != expected:
            return None
        moments = np.load(path)
    except (OSError, ValueError):
        return None
    if moments.dtype != np.int64 or moments.shape[:2] != (rows, 2):
        return None
    moments.flags.writeable = False
    return moments


def _build(stem: str, key: str, files: Sequence[str], shape: tuple[int, ...],
           how: _Decoding) -> ResizeCache:
    """Decode ``files`` into ``stem.npy`` (+ sidecar) atomically; the caller holds the lock."""
    for stale in glob.glob(glob.escape(stem) + ".*.tmp-*"):  # left by a killed builder
        os.remove(stale)
    token = f"tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp, tmp_moments = f"{stem}.npy.{token}", f"{stem}.moments.npy.{token}"
    try:
        offset = _allocate(tmp, shape)
        failed = _decode_into(tmp, offset, files, shape, how)
        digest, moments = _digest_and_moments(tmp, offset, shape)
        with open(tmp_moments, "wb") as f:
            np.save(f, moments)
        info = {"format": FORMAT_VERSION, "key": key, "shape": list(shape), "dtype": "uint8",
                "method": RESIZE_METHOD, "xxh3": digest, "files": len(files),
                "moments_xxh3": file_digest(tmp_moments),
                "origin": how.origin, "failed": {str(k): v for k, v in sorted(failed.items())}}
        os.replace(tmp_moments, stem + ".moments.npy")
        os.replace(tmp, stem + ".npy")
        write_json_atomic(stem + ".json", info)
    finally:
        for path in (tmp, tmp_moments):
            if os.path.exists(path):
                os.remove(path)
    _remove_older(stem, how.origin, shape)
    images = np.load(stem + ".npy", mmap_mode="r")
    moments.flags.writeable = False
    return ResizeCache(stem + ".npy", images, failed, file_stamp(os.stat(stem + ".npy")),
                       moments)


def _digest_and_moments(path: str, offset: int, shape: tuple[int, ...],
                        chunk_bytes: int = 16 << 20) -> tuple[str, np.ndarray]:
    """In one read of the built file: its xxh3-128 (as ``file_digest``) and every row's
    moments (``moments.row_moments``)."""
    import xxhash

    digest = xxhash.xxh3_128()
    row_bytes = math.prod(shape[1:])
    per = max(1, chunk_bytes // max(1, row_bytes))
    moments = np.empty((shape[0], 2, shape[-1]), np.int64)
    with open(path, "rb") as file:
        digest.update(file.read(offset))
        for start in range(0, shape[0], per):
            count = min(per, shape[0] - start)
            block = file.read(count * row_bytes)
            digest.update(block)
            moments[start:start + count] = row_moments(
                np.frombuffer(block, np.uint8).reshape(count, *shape[1:]))
        digest.update(file.read())  # nothing, unless the file outgrew its shape
    return digest.hexdigest(), moments


def _remove_older(stem: str, origin: str | None, shape: tuple[int, ...]) -> None:
    """Remove the other caches of ``origin`` at this size; open memmaps keep their pages."""
    if origin is None:
        return
    prefix = stem[:stem.rindex("-") + 1]  # <name>-<H>x<W>-
    for sidecar in glob.glob(glob.escape(prefix) + "*.json"):
        other = sidecar[:-len(".json")]
        if other == stem:
            continue
        try:
            with open(sidecar, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue
        if info.get("origin") == origin and tuple(info.get("shape", ()))[1:] == shape[1:]:
            for path in (other + ".npy", other + ".moments.npy", sidecar):
                with contextlib.suppress(OSError):
                    os.remove(path)


def _allocate(path: str, shape: tuple[int, ...]) -> int:
    """Create a zero-filled (sparse) ``.npy`` of uint8 ``shape``; return the data offset."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)),
              "fortran_order": False, "shape": shape}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        offset = f.tell()
        f.truncate(offset + math.prod(shape))
    return offset


def _decode_into(path: str, offset: int, files: Sequence[str], shape: tuple[int, ...],
                 how: _Decoding) -> dict[int, str]:
    """Decode every file into its row of ``path``; return ``{row: reason}`` of failures."""
    desc = f"Resizing {len(files)} images to {shape[1]}x{shape[2]}"
    in_processes = how.processes
    if in_processes is None:  # processes: decoding small images is Python holding the GIL
        in_processes = decode.use_processes(len(files))
    fd = os.open(path, os.O_WRONLY)
    try:
        if in_processes:
            failed = decode.decode_in_processes(
                path, offset, files, shape, processes=how.workers or decode.default_processes(),
                on_error=how.on_error, desc=desc)
        else:
            failed = _decode_in_threads(fd, offset, files, how.read, shape,
                                        how.workers or default_workers(), how.on_error, desc)
        os.fsync(fd)  # flushes the file's pages, whichever process wrote them
    finally:
        os.close(fd)
    return failed


def _decode_in_threads(fd: int, offset: int, files: Sequence[str],
                       read: Callable[[str], bytes], shape: tuple[int, ...], workers: int,
                       on_error: str, desc: str) -> dict[int, str]:
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
