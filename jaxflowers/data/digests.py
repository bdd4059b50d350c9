"""Digests that name an image set's contents exactly: each image's xxh3-64 (stored with a
resize cache) and a set's digest from them and its labels, which a checkpoint records to
recognise its training data on resume without reading a set on disk again.
"""
from __future__ import annotations

import numpy as np

from jaxflowers.data.feed import image_shape, read_rows, stored_rows

__all__ = ["PREFIX", "bytes_digest", "row_digests", "set_digest"]

PREFIX = "rows-xxh3:"  # what set_digest's values start with (bytes_digest's have none)
_CHUNK_BYTES = 64 << 20  # a set on disk is read in chunks of this size, never loaded whole


def row_digests(block) -> np.ndarray:
    """uint64 (n,): the xxh3-64 of each image's bytes in a uint8 (n, H, W, C) block."""
    import xxhash

    block = np.ascontiguousarray(block, np.uint8)
    return np.fromiter((xxhash.xxh3_64_intdigest(row) for row in block), np.uint64,
                       count=block.shape[0])


def set_digest(data) -> str:
    """``PREFIX`` and the xxh3-128 of a set's image digests in order and its labels.

    A set whose ``row_digests()`` returns its images' stored digests (an ``ImageFolder``
    whose resize cache holds them) is not read; any other set is read once, in chunks.
    Equal images and labels give equal digests whichever kind of set holds them.
    """
    import xxhash

    stored = stored_rows(data, "digests")
    if stored is None:
        parts = [row_digests(block) for block in _blocks(data)]
        stored = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    digest = xxhash.xxh3_128()
    digest.update(np.ascontiguousarray(stored, "<u8").data)
    digest.update(np.ascontiguousarray(np.asarray(data.labels), "<i4").data)
    return PREFIX + digest.hexdigest()


def bytes_digest(data) -> str:
    """The xxh3-128 of a set's image bytes in order, then its int32 labels: the data digest
    that checkpoints of format 3 hold (a pass over the set)."""
    import xxhash

    digest = xxhash.xxh3_128()
    for block in _blocks(data):
        digest.update(np.ascontiguousarray(block).data)
    digest.update(np.ascontiguousarray(np.asarray(data.labels, np.int32)).data)
    return digest.hexdigest()


def _blocks(data):
    """The set's images in row order, read about ``_CHUNK_BYTES`` at a time."""
    step = max(1, _CHUNK_BYTES // max(1, int(np.prod(image_shape(data)))))
    for start in range(0, len(data), step):
        yield read_rows(data, np.arange(start, min(start + step, len(data))))
