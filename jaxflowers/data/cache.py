"""Resize once: decode every image of a folder into one memory-mapped uint8 ``.npy`` file.

The MATLAB workflow pre-resizes a datastore with ``transform`` + ``writeall``; here that is
automatic. :func:`open_or_build` returns the cache for a list of files, building it the
first time and reusing it afterwards, across runs and processes.

* **Key.** A sha256 of the file list (paths or URLs, with each file's size and mtime or
  ETag), the target size and the resize method. Any change to a file, the list or the size
  gives a new cache; nothing is ever served stale.
* **Process-safe, atomic.** The build holds ``fcntl.flock`` on ``<stem>.lock``; the array
  is written to a temporary file in the same folder and moved into place with
  ``os.replace``, so two processes building at once end with one valid cache and a reader
  never sees half a file.
* **Integrity.** A sidecar ``<stem>.json`` holds the key, shape, dtype and the sha256 of the
  whole ``.npy`` file. A cache whose bytes no longer match is rebuilt with a warning, never
  used.
* **Fast.** Images are read, decoded and written straight into the file with ``os.pwrite``,
  so memory stays flat however large the set. Many local files on a machine with more than
  two cores are decoded in worker processes (:mod:`jaxflowers.data.decode`): decoding and
  resizing small images is mostly Python holding the GIL, so threads stop scaling at a few
  cores. Otherwise (small sets, remote sources) a thread pool does it.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import glob
import hashlib
import io
import json
import math
import os
import re
import secrets
import warnings
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np
from PIL import Image, ImageOps

RESIZE_METHOD = "pil-lanczos"  # recorded in the key and the sidecar; change it if decoding changes
FORMAT_VERSION = 1
ON_ERROR = ("raise", "skip")
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


@dataclasses.dataclass(frozen=True)
class ResizeCache:
    """An opened resize cache.

    Attributes:
      path: the ``.npy`` file.
      images: read-only memory map, uint8 (N, H, W, 3), one row per file in list order.
      failed: ``{row: reason}`` for files that could not be decoded (rows left zero; never
        hand them out). Empty unless the cache was built with ``on_error="skip"``.
    """

    path: str
    images: np.ndarray
    failed: dict[int, str]

    def take(self, rows: np.ndarray) -> np.ndarray:
        """uint8 (len(rows), H, W, 3), read-only: a slice of the memory map when ``rows`` is
        a contiguous run (a whole folder), else a copy gathered into memory."""
        if rows.size and np.array_equal(rows, np.arange(rows[0], rows[0] + rows.size)):
            return self.images[rows[0]:rows[0] + rows.size]
        out = self.images[rows]
        out.flags.writeable = False
        return out


def default_workers() -> int:
    """Threads that read and decode: ``min(32, cpu_count + 4)``, as ``ThreadPoolExecutor``."""
    return min(32, (os.cpu_count() or 1) + 4)


def default_cache_dir() -> str:
    """``$JAXFLOWERS_CACHE_DIR`` if set, else ``~/.cache/jaxflowers``."""
    return os.path.expanduser(os.environ.get("JAXFLOWERS_CACHE_DIR") or "~/.cache/jaxflowers")


def decode_image(data: bytes, image_size: tuple[int, int]) -> np.ndarray:
    """Decode an encoded image and resize it, like MATLAB's ``imresize(imread(f), [h w])``.

    EXIF orientation is applied; grayscale, palette, alpha (dropped, as ``imread`` does),
    CMYK and 16-bit images become 8-bit RGB. The resize ignores the aspect ratio (as
    ``augmentedImageDatastore`` does) and uses PIL's antialiased Lanczos filter.

    Args:
      data: the bytes of a JPEG, PNG, BMP, GIF (first frame), WebP or TIFF file.
      image_size: (height, width) of the result.

    Returns:
      uint8 array (height, width, 3).

    Raises:
      ValueError for an empty input; OSError (from PIL) for a truncated or unknown file.
    """
    if not data:
        raise ValueError("file is empty (0 bytes)")
    height, width = image_size
    with Image.open(io.BytesIO(data)) as img:
        img.load()  # decode everything now: a truncated file must fail here, not pass as grey
        ImageOps.exif_transpose(img, in_place=True)
        rgb = _to_rgb(img)
        if rgb.size != (width, height):
            rgb = rgb.resize((width, height), Image.Resampling.LANCZOS)
        return np.asarray(rgb, dtype=np.uint8)


def _to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB of any PIL mode; 16-bit gray is scaled (PIL's own convert would clip it)."""
    if img.mode in _SIXTEEN_BIT_MODES:
        wide = np.clip(np.asarray(img).astype(np.int64), 0, 65535)
        return Image.fromarray(((wide + 128) // 257).astype(np.uint8), "L").convert("RGB")
    if img.mode == "F":
        return Image.fromarray(np.clip(np.asarray(img), 0, 255).round().astype(np.uint8)
                               ).convert("RGB")
    if img.mode in ("P", "PA"):  # via RGBA: palette transparency would otherwise warn
        img = img.convert("RGBA")
    return img if img.mode == "RGB" else img.convert("RGB")


def cache_key(files: Sequence[str], fingerprints: Sequence[str],
              image_size: tuple[int, int]) -> str:
    """Hex sha256 naming the cache of ``files`` (with their size/mtime/ETag) at ``image_size``."""
    blob = json.dumps({"format": FORMAT_VERSION, "method": RESIZE_METHOD,
                       "size": list(image_size), "files": list(zip(files, fingerprints))})
    return hashlib.sha256(blob.encode()).hexdigest()


def open_or_build(files: Sequence[str], fingerprints: Sequence[str],
                  read: Callable[[str], bytes], *, image_size: tuple[int, int],
                  cache_dir: str | os.PathLike | None = None, name: str = "images",
                  workers: int | None = None, on_error: str = "raise",
                  processes: bool | None = False) -> ResizeCache:
    """The resize cache of ``files``: opened if a valid one exists, else built (once).

    Args:
      files: N paths or URLs, in row order.
      fingerprints: N strings that change when a file changes (size and mtime, or ETag).
      read: returns the bytes of one entry of ``files``; called from worker threads.
      image_size: (height, width) of every cached image.
      cache_dir: folder for the cache; default :func:`default_cache_dir`.
      name: readable prefix of the cache's file names (the folder's name).
      workers: decoding threads, or processes when decoding in processes; default
        :func:`default_workers` threads or ``decode.default_processes()`` processes.
      on_error: ``"raise"``: a file that cannot be read or decoded raises ``OSError``
        naming it; ``"skip"``: it is recorded in ``ResizeCache.failed``.
      processes: build in decode processes, which read ``files`` as local paths
        themselves (not through ``read``), or in threads (False). None (for local files
        only) decides: processes for at least ``decode.PROCESS_MIN_FILES`` files on at
        least ``decode.PROCESS_MIN_CPUS`` CPUs.

    Returns:
      A :class:`ResizeCache` whose ``images`` is uint8 (N, height, width, 3).
    """
    cache_dir = os.path.abspath(os.fspath(cache_dir or default_cache_dir()))
    os.makedirs(cache_dir, exist_ok=True)
    key = cache_key(files, fingerprints, image_size)
    stem = os.path.join(cache_dir, f"{_slug(name)}-{image_size[0]}x{image_size[1]}-{key[:16]}")
    shape = (len(files), *image_size, 3)
    cache, _ = _open_valid(stem, key, shape)
    if cache is None:
        with _locked(stem + ".lock"):  # re-check: another process may have built it meanwhile
            cache, problem = _open_valid(stem, key, shape)
            if cache is None:
                if problem:
                    warnings.warn(f"resize cache {stem}.npy is invalid ({problem}); rebuilding it",
                                  stacklevel=2)
                how = _Decoding(read, workers, on_error, processes)
                cache = _build(stem, key, files, shape, how)
    if on_error == "raise" and cache.failed:
        row, reason = min(cache.failed.items())
        raise read_error(files[row], f"{reason} (recorded in {cache.path})")
    return cache


def read_error(file: str, reason: str) -> OSError:
    """The error of ``on_error="raise"`` for a file that could not be read or decoded."""
    return OSError(f"cannot read image {file}: {reason}; "
                   "pass on_error='skip' to leave such files out")


def failure_reason(exc: BaseException) -> str:
    """How ``ResizeCache.failed`` words the error of one file: ``"OSError: ..."``."""
    return f"{type(exc).__name__}: {exc}"


class _Decoding(NamedTuple):
    """How a build decodes: the reader, the worker count and kind, and what an error does."""
    read: Callable[[str], bytes]  # used by threads; processes read local files themselves
    workers: int | None  # threads or processes; None: the default of the kind
    on_error: str
    processes: bool | None  # None: decided by decode.use_processes


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
    """(cache, "") if ``stem`` holds a valid cache for ``key``; else (None, what is wrong).

    A missing cache is not a problem (""); a present but damaged one is.
    """
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
    if _sha256(npy) != info.get("sha256"):
        return None, "sha256 of the file does not match its sidecar; the file changed on disk"
    return ResizeCache(npy, images, {int(k): v for k, v in info.get("failed", {}).items()}), ""


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _build(stem: str, key: str, files: Sequence[str], shape: tuple[int, ...],
           how: _Decoding) -> ResizeCache:
    """Decode ``files`` into ``stem.npy`` (+ sidecar) atomically; the caller holds the lock."""
    for stale in glob.glob(glob.escape(stem) + ".*.tmp-*"):  # left by a killed builder
        os.remove(stale)
    tmp = f"{stem}.npy.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        offset = _allocate(tmp, shape)
        failed = _decode_into(tmp, offset, files, shape, how)
        info = {"format": FORMAT_VERSION, "key": key, "shape": list(shape), "dtype": "uint8",
                "method": RESIZE_METHOD, "sha256": _sha256(tmp), "files": len(files),
                "failed": {str(k): v for k, v in sorted(failed.items())}}
        os.replace(tmp, stem + ".npy")
        _write_json_atomic(stem + ".json", info)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return ResizeCache(stem + ".npy", np.load(stem + ".npy", mmap_mode="r"), failed)


def _allocate(path: str, shape: tuple[int, ...]) -> int:
    """Create a zero-filled (sparse) ``.npy`` of uint8 ``shape``; return the data offset."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)),
              "fortran_order": False, "shape": shape}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        offset = f.tell()
        f.truncate(offset + math.prod(shape))
    return offset


def _write_json_atomic(path: str, info: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)  # ASCII: file names may hold undecodable bytes
    os.replace(tmp, path)


def _decode_into(path: str, offset: int, files: Sequence[str], shape: tuple[int, ...],
                 how: _Decoding) -> dict[int, str]:
    """Decode every file into its row of ``path``; return ``{row: reason}`` of failures."""
    from jaxflowers.data import decode

    desc = f"Resizing {len(files)} images to {shape[1]}x{shape[2]}"
    in_processes = how.processes
    if in_processes is None:
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
    """Decode every file into its row of the file ``fd`` in a thread pool; ``{row: reason}``."""
    # Tasks of several rows: one future per tiny image (CIFAR) costs more than decoding it.
    step = max(1, min(32, len(files) // (8 * workers)))
    pool = concurrent.futures.ThreadPoolExecutor(workers)
    try:
        decode = functools.partial(decode_rows, fd, offset, files, read, shape)
        chunks = [range(i, min(i + step, len(files))) for i in range(0, len(files), step)]
        futures = {pool.submit(decode, rows): rows for rows in chunks}
        return _collect(futures, files, on_error, desc)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # before the caller closes fd


def decode_rows(fd: int, offset: int, files: Sequence[str] | Mapping[int, str],
                read: Callable[[str], bytes], shape: tuple[int, ...],
                rows: range) -> dict[int, Exception]:
    """Decode ``rows`` into the file ``fd``; return the exception of each row that failed.

    ``files[row]`` names the file of each row (a decode process gets only its own rows).
    """
    failed = {}
    for row in rows:
        try:
            image = decode_image(read(files[row]), shape[1:3])  # module lookup: tests count it
        except Exception as exc:  # any reader or decoder error belongs to this one file
            failed[row] = exc
            continue
        os.pwrite(fd, image.tobytes(), offset + row * math.prod(shape[1:]))  # disk full: abort
    return failed


def _collect(futures: dict, files: Sequence[str], on_error: str, desc: str) -> dict[int, str]:
    """Wait for ``futures`` ({future: its rows}) under a progress bar; ``{row: reason}``."""
    from tqdm.auto import tqdm

    failed: dict[int, str] = {}
    with tqdm(total=len(files), desc=desc, unit="img") as bar:
        for future in concurrent.futures.as_completed(futures):
            for row, exc in sorted(future.result().items()):
                failed[row] = failure_reason(exc)
                if on_error == "raise":
                    raise read_error(files[row], failed[row]) from exc
            bar.update(len(futures[future]))
    return failed
