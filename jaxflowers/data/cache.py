"""Resize once (MATLAB's ``transform`` + ``writeall``): a folder into one uint8 ``.npy`` memmap.

The key digests the file list with fingerprints, the size and the resize method. A build holds
``flock`` on ``<stem>.lock`` and lands by ``os.replace``; the sidecar ``<stem>.json`` holds an
xxh3-128 digest (a mismatch rebuilds), read in full on open unless the file's stamp (size,
times, inode) is the one ``<stem>.checked`` recorded at the last full check, as the source
images' own stat fingerprints are trusted. Memory stays flat (``os.pwrite``).
Each row's channel sums and digest are stored too (``<stem>.moments.npy``,
``<stem>.digests.npy``), so a set streamed from the cache needs no pass over its images for its
statistics or to be recognised by a checkpoint.
"""
from __future__ import annotations

import contextlib
import dataclasses
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
from jaxflowers.data.digests import row_digests
from jaxflowers.data.imread import read_error
from jaxflowers.data.mapped import take_rows
from jaxflowers.data.moments import row_moments
from jaxflowers.host.files import unwritable, write_json_atomic

__all__ = ["FORMAT_VERSION", "ON_ERROR", "RESIZE_METHOD", "ResizeCache", "cache_key",
           "default_cache_dir", "file_digest", "file_stamp", "open_or_build",
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
      stamp: ``file_stamp`` of the file when its digest was checked, now or at a check
        recorded with the same stamp ("" for a cache deleted once loaded): another process
        may ``reopen`` it unchecked while the stamp holds.
      moments: int64 (N, 2, 3), each row's per-channel pixel sum and sum of squares, stored
        beside the images when the cache was built (``<stem>.moments.npy``, its digest in the
        sidecar); None where they are missing or do not match, and in a cache reopened
        from a listing (its check is the file's stamp alone).
      digests: uint64 (N,), each row's xxh3-64 (``digests.row_digests``), stored and checked
        as the moments are (``<stem>.digests.npy``); None in the same cases.
    """

    path: str
    images: np.ndarray
    failed: dict[int, str]
    stamp: str = ""
    moments: np.ndarray | None = None
    digests: np.ndarray | None = None

    def take(self, rows: np.ndarray) -> np.ndarray:
        """uint8 (len(rows), H, W, 3), read-only: a memmap slice if contiguous, else a copy."""
        if rows.size and np.array_equal(rows, np.arange(rows[0], rows[0] + rows.size)):
            return self.images[rows[0]:rows[0] + rows.size]
        out = take_rows(self.images, rows)
        out.flags.writeable = False
        return out


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
                  processes: bool | None = False, origin: str | None = None,
                  verify: bool = False) -> ResizeCache:
    """The uint8 (N, height, width, 3) :class:`ResizeCache` of ``files``: opened, or built once.

    Args:
      files, fingerprints: N paths or URLs in row order, and N strings that change with a file.
      read: returns the bytes of one entry of ``files``; called from worker threads.
      image_size, cache_dir, workers, on_error: as ``ImageFolder``'s.
      name: readable prefix of the cache's file names.
      processes: decode in processes (reading local paths), threads (False), or None: decide.
      origin: the folder or URL; a new cache of it removes its older ones at the same size.
      verify: read the whole cache to check its digest even if its stamp is the one of its
        last check (a set of many gigabytes is read once more).
    """
    cache_dir = os.path.abspath(os.fspath(cache_dir or default_cache_dir()))
    key = cache_key(files, fingerprints, image_size)
    base = f"{_slug(name)}-{image_size[0]}x{image_size[1]}-{key[:16]}"
    stem, shape = os.path.join(cache_dir, base), (len(files), *image_size, 3)
    how = _Decoding(read, workers, on_error, processes, origin)
    cache, _ = _open_valid(stem, key, shape, verify)  # a read-only folder may hold one
    if cache is None:
        problem = unwritable(cache_dir)
        if problem:
            warnings.warn(f"resize cache folder {cache_dir} cannot be written ({problem}); "
                          "going on without the cache: the images are decoded into a "
                          "temporary file, deleted once loaded", stacklevel=2)
            cache = _build_unkept(base, key, files, shape, how)
        else:
            cache = _build_kept(stem, key, files, shape, how, verify)
    if on_error == "raise" and cache.failed:
        row, reason = min(cache.failed.items())
        raise read_error(files[row], f"{reason} (recorded in {cache.path})")
    return cache


def _build_kept(stem: str, key: str, files: Sequence[str], shape: tuple[int, ...],
                how: _Decoding, verify: bool) -> ResizeCache:
    """Build the cache at ``stem`` under its lock, unless another process built it meanwhile."""
    with _locked(stem + ".lock"):
        cache, problem = _open_valid(stem, key, shape, verify)
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


def _open_valid(stem: str, key: str, shape: tuple[int, ...],
                verify: bool) -> tuple[ResizeCache | None, str]:
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
    if verify or _last_check(stem) != (info.get("xxh3"), stamp):
        if file_digest(npy) != info.get("xxh3"):
            return None, "the file's digest does not match its sidecar; the file changed on disk"
        _record_check(stem, info["xxh3"], stamp)
    failed = {int(k): v for k, v in info.get("failed", {}).items()}
    return ResizeCache(npy, images, failed, stamp, *(
        _load_per_row(stem, info, kind, shape[0]) for kind in _PER_ROW)), ""


def _last_check(stem: str) -> tuple[str, str] | None:
    """(digest, stamp) that ``<stem>.checked`` records the file had at its last full check."""
    try:
        with open(stem + ".checked", encoding="utf-8") as f:
            record = json.load(f)
        return record["xxh3"], record["stamp"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _record_check(stem: str, digest: str, stamp: str) -> None:
    """Record that the file with ``stamp`` had ``digest``; left out where the folder is
    read-only (each open then reads the whole file)."""
    with contextlib.suppress(OSError):
        write_json_atomic(stem + ".checked", {"xxh3": digest, "stamp": stamp})


# What the cache stores of each row beside its images: file suffix, dtype, a row's shape.
_PER_ROW = {"moments": (np.int64, (2, 3)), "digests": (np.uint64, ())}


def _load_per_row(stem: str, info: dict, kind: str, rows: int) -> np.ndarray | None:
    """The rows' ``kind`` (a key of ``_PER_ROW``) stored at ``<stem>.<kind>.npy`` if the
    sidecar ``info`` names its digest and it matches (read into memory); else None, and what
    needs it reads the images."""
    path, expected = f"{stem}.{kind}.npy", info.get(f"{kind}_xxh3")
    if not expected or not os.path.exists(path):
        return None
    try:
        if file_digest(path) != expected:
            return None
        values = np.load(path)
    except (OSError, ValueError):
        return None
    dtype, row_shape = _PER_ROW[kind]
    if values.dtype != dtype or values.shape != (rows, *row_shape):
        return None
    values.flags.writeable = False
    return values


def _build(stem: str, key: str, files: Sequence[str], shape: tuple[int, ...],
           how: _Decoding) -> ResizeCache:
    """Decode ``files`` into ``stem.npy`` (+ sidecar) atomically; the caller holds the lock."""
    for stale in glob.glob(glob.escape(stem) + ".*.tmp-*"):  # left by a killed builder
        os.remove(stale)
    token = f"tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp = f"{stem}.npy.{token}"
    temporary = {kind: f"{stem}.{kind}.npy.{token}" for kind in _PER_ROW}
    try:
        offset = _allocate(tmp, shape)
        failed = decode.decode_into(tmp, offset, files, shape, read=how.read,
                                    workers=how.workers, on_error=how.on_error,
                                    processes=how.processes)
        digest, per_row = _digest_and_rows(tmp, offset, shape)
        for kind, path in temporary.items():
            with open(path, "wb") as f:
                np.save(f, per_row[kind])
        info = {"format": FORMAT_VERSION, "key": key, "shape": list(shape), "dtype": "uint8",
                "method": RESIZE_METHOD, "xxh3": digest, "files": len(files),
                **{f"{kind}_xxh3": file_digest(path) for kind, path in temporary.items()},
                "origin": how.origin, "failed": {str(k): v for k, v in sorted(failed.items())}}
        for kind, path in temporary.items():
            os.replace(path, f"{stem}.{kind}.npy")
        os.replace(tmp, stem + ".npy")
        write_json_atomic(stem + ".json", info)
    finally:
        for path in (tmp, *temporary.values()):
            if os.path.exists(path):
                os.remove(path)
    _remove_older(stem, how.origin, shape)
    images = np.load(stem + ".npy", mmap_mode="r")
    for values in per_row.values():
        values.flags.writeable = False
    stamp = file_stamp(os.stat(stem + ".npy"))
    _record_check(stem, digest, stamp)
    return ResizeCache(stem + ".npy", images, failed, stamp, **per_row)


def _digest_and_rows(path: str, offset: int, shape: tuple[int, ...],
                     chunk_bytes: int = 16 << 20) -> tuple[str, dict[str, np.ndarray]]:
    """In one read of the built file: its xxh3-128 (as ``file_digest``) and what
    ``_PER_ROW`` stores of every row (``moments.row_moments``, ``digests.row_digests``)."""
    import xxhash

    digest = xxhash.xxh3_128()
    row_bytes = math.prod(shape[1:])
    per = max(1, chunk_bytes // max(1, row_bytes))
    per_row = {kind: np.empty((shape[0], *row_shape), dtype)
               for kind, (dtype, row_shape) in _PER_ROW.items()}
    with open(path, "rb") as file:
        digest.update(file.read(offset))
        for start in range(0, shape[0], per):
            count = min(per, shape[0] - start)
            block = file.read(count * row_bytes)
            digest.update(block)
            rows = np.frombuffer(block, np.uint8).reshape(count, *shape[1:])
            per_row["moments"][start:start + count] = row_moments(rows)
            per_row["digests"][start:start + count] = row_digests(rows)
        digest.update(file.read())  # nothing, unless the file outgrew its shape
    return digest.hexdigest(), per_row


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
            for path in (other + ".npy", *(f"{other}.{kind}.npy" for kind in _PER_ROW),
                         other + ".checked", sidecar):
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
