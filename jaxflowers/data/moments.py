"""Per-channel statistics of uint8 images, summed in exact integers: over a set, or per image
(stored with a resize cache, so a streamed set's statistics need no pass over its images).

Integer sums make every route give the same numbers: the resident feed's on the devices,
these on the host, and the per-image ones summed over any subset.
"""
from __future__ import annotations

import concurrent.futures
import os

import numpy as np

from jaxflowers.data.feed import image_shape, read_rows, stored_rows

__all__ = ["channel_stats", "row_moments", "stats_from_moments"]


def channel_stats(data, chunk: int = 16, *,
                  num_threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std (float32 (C,)) of a set's (or uint8 (N, H, W, C)) images.

    A set whose ``row_moments()`` returns its images' stored sums (an ``ImageFolder`` whose
    resize cache holds them) is summed from those. Otherwise the images are read ``chunk`` at
    a time (:func:`~jaxflowers.data.feed.read_rows`) in ``num_threads`` threads (default
    ``min(16, cpu_count)``; numpy's loops run without the GIL). Either way the result equals
    the resident feed's sums on the devices."""
    count = len(data)
    shape = (count, *image_shape(data)) if not isinstance(data, np.ndarray) else data.shape
    pixels = int(np.prod(shape[:-1]))
    stored = stored_rows(data, "moments")
    if stored is not None:
        return stats_from_moments(stored[:, 0].sum(0), stored[:, 1].sum(0), pixels)
    threads = num_threads or min(16, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(threads, "jaxflowers-stats") as pool:
        parts = list(pool.map(
            lambda s: row_moments(read_rows(data, np.arange(s, min(s + chunk, count)))).sum(0),
            range(0, count, chunk)))
    total = sum(parts, np.zeros((2, shape[-1]), np.int64))
    return stats_from_moments(total[0], total[1], pixels)


def row_moments(block) -> np.ndarray:
    """int64 (n, 2, C): each image of a uint8 (n, H, W, C) block's pixel sum and sum of
    squares per channel."""
    block = np.asarray(block, np.uint8)
    n, channels = block.shape[0], block.shape[-1]
    rows = block.reshape(n, -1, block.shape[-2] * channels)  # each image's rows of W * C values
    out = np.empty((n, 2, channels), np.int64)
    out[:, 0] = rows.sum(1, dtype=np.uint64).reshape(n, -1, channels).sum(1)
    # squares summed down an image's rows, in uint32 while they fit (255**2 x 66,000 rows)
    wide = np.uint32 if rows.shape[1] * 255**2 < 2**32 else np.uint64
    squares = np.einsum("nhk,nhk->nk", rows, rows, dtype=wide, casting="safe")
    out[:, 1] = squares.astype(np.uint64).reshape(n, -1, channels).sum(1)
    return out


def stats_from_moments(total, squares, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) float32 from per-channel sums and sums of squares; std at least 1."""
    mean = np.asarray(total, np.float64) / count
    std = np.sqrt(np.maximum(np.asarray(squares, np.float64) / count - mean**2, 0.0))
    return mean.astype(np.float32), np.maximum(std, 1.0).astype(np.float32)
