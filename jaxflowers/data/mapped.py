"""Rows of an array that may be a memory map of a file, with their pages asked for ahead.

Indexing a memory map faults its pages in one at a time, and each fault on disk reads
around itself: for images scattered over a set larger than memory, that reads several
times the bytes needed, one fault after another. Advising the kernel of the rows' byte
ranges first (``madvise(MADV_WILLNEED)``) sends exactly those reads out together.
"""
from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np

__all__ = ["take_rows"]

# Bytes advised ahead of the copy: the reads stay in flight while the previous block copies,
# and a large take does not ask for more pages than memory holds at once.
_AHEAD_BYTES = 64 << 20
_madvise = None  # libc's madvise once looked up; False where there is none


def take_rows(array: np.ndarray, rows) -> np.ndarray:
    """A new array of ``array[rows]``; a memory map's rows are read ahead in blocks.

    Args:
      array: any array (N, ...); a ``np.memmap`` or a view of one gets the read-ahead.
      rows: int (n,) positions along the first axis, in any order (ascending reads best).

    Returns:
      ``array[rows]`` as a new in-memory array.
    """
    rows = np.asarray(rows, np.int64)
    row_bytes = int(np.prod(array.shape[1:], dtype=np.int64)) * array.itemsize
    if rows.size == 0 or row_bytes == 0 or not _advisable(array, row_bytes):
        return np.asarray(array[rows])
    out = np.empty((rows.size, *array.shape[1:]), array.dtype)
    per = max(1, _AHEAD_BYTES // row_bytes)
    starts = range(0, rows.size, per)
    _advise(array, rows[:per], row_bytes)
    for start in starts:
        if start + per < rows.size:
            _advise(array, rows[start + per:start + 2 * per], row_bytes)
        np.take(array, rows[start:start + per], axis=0, out=out[start:start + per])
    return out


def _advisable(array, row_bytes: int) -> bool:
    """Whether ``array`` lies in a memory map with each row one contiguous byte range."""
    if not isinstance(array, np.ndarray) or array.ndim < 1 or array.strides[0] < row_bytes:
        return False
    if array.ndim > 1 and not array[:1].flags.c_contiguous:
        return False
    base = array
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            return _libc_madvise() is not None
        base = base.base
    return isinstance(base, mmap.mmap) and _libc_madvise() is not None


def _advise(array: np.ndarray, rows: np.ndarray, row_bytes: int) -> None:
    """``MADV_WILLNEED`` over the pages of ``rows``, adjacent rows merged into one range."""
    page = mmap.PAGESIZE
    starts = np.sort(array.ctypes.data + rows * array.strides[0])
    first = starts - starts % page
    last = starts + row_bytes
    # A range continues while the next row starts within (or right after) its pages.
    breaks = np.flatnonzero(first[1:] > last[:-1]) + 1
    madvise = _libc_madvise()
    for lo, hi in zip(np.concatenate(([0], breaks)), np.concatenate((breaks, [len(starts)]))):
        madvise(int(first[lo]), int(last[hi - 1] - first[lo]), mmap.MADV_WILLNEED)


def _libc_madvise():
    """libc's ``madvise(addr, length, advice)`` (advice only: its errors are ignored), or None
    where the platform has none."""
    global _madvise
    if _madvise is None:
        _madvise = False
        if sys.platform != "win32" and hasattr(mmap, "MADV_WILLNEED"):
            try:
                function = ctypes.CDLL(None, use_errno=True).madvise
                function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                function.restype = ctypes.c_int
                _madvise = function
            except (OSError, AttributeError):
                pass
    return _madvise or None
