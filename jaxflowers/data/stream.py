"""Streamed epochs for sets that don't fit on the devices: grain reads uint8 batches ahead.

The plan is the resident feed's (:func:`~jaxflowers.data.feed.epoch_order`): the same
seeded permutations, the same dropped partial batches, so the same seed trains the same
numbers either way. Each plan row (one global mini-batch) becomes one grain element: the
rows of the (memory-mapped) images and labels it names, gathered on the host. Augmentation
and normalisation stay on the device, in the same step as resident training.

Read-ahead uses grain's threads (``to_iter_dataset(ReadOptions(...))``), not its worker
processes: the per-batch host work is one gather (a memory copy, which numpy does without
the GIL), and ``mp_prefetch`` would pickle the images into every worker (a memory map is
pickled as a full copy), needs absl flags marked parsed in grain 0.2.18
(``UnparsedFlagAccessError`` otherwise; the thread path reads none), and its workers take
seconds to start.

With several JAX processes each one reads only its columns of every global batch
(``grain.sharding.ShardByJaxProcess``: process p the p-th 1/P), and the training program
assembles the global batch from those shares, which the mesh lays out process by process.
Every process plans the same epochs (the plan is seeded), so the global batches, and the
numbers, are those of one process.
"""
from __future__ import annotations

import os

import grain
import numpy as np

from jaxflowers.data.feed import epoch_order, image_shape, steps_per_epoch

# Batches grain keeps ready on the host: enough to ride out a slow read (page faults of a
# memory map on a cold disk) without holding much memory (a 128 x 224^2 batch is 19 MB).
PREFETCH_BATCHES = 8


def process_columns(order: np.ndarray, shard_index: int, shard_count: int) -> np.ndarray:
    """This process's contiguous share of every global batch in ``order``.

    Args:
      order: int (iterations, global batch) sample indices.
      shard_index, shard_count: this process and how many there are.

    Returns:
      int (iterations, global batch / shard_count).
    """
    width, rest = divmod(order.shape[1], shard_count)
    if rest:
        raise ValueError(f"mini_batch_size={order.shape[1]} is not divisible by "
                         f"{shard_count} processes")
    return order[:, shard_index * width:(shard_index + 1) * width]


def host_batches(data, order: np.ndarray, *, num_threads: int | None = None,
                 prefetch: int = PREFETCH_BATCHES) -> grain.IterDataset:
    """A grain pipeline of ``data``'s batches in the order ``order`` names, read ahead.

    Args:
      data: ``images`` uint8 (N, H, W, C) (a memory map is read batch by batch) and
        ``labels`` int (N,).
      order: int (iterations, b) sample indices, one row per batch (this process's columns).
      num_threads: reader threads; default ``min(8, cpu_count)``.
      prefetch: batches read ahead.

    Returns:
      An ``IterDataset`` of dicts: ``"index"`` int32 (b,), ``"images"`` uint8
      (b, H, W, C), ``"labels"`` int32 (b,); one per row of ``order``, in order.
    """
    images, labels = data.images, np.asarray(data.labels, np.int32)

    def gather(index):
        # Read in ascending order (sequential for a memory map on disk), then put back.
        ascending = np.argsort(index, kind="stable")
        batch = np.empty((len(index), *images.shape[1:]), np.uint8)
        batch[ascending] = images[index[ascending]]
        return {"index": index, "images": batch, "labels": labels[index]}

    threads = num_threads or min(8, os.cpu_count() or 1)
    return (grain.MapDataset.source(np.asarray(order, np.int32)).map(gather)
            .to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch)))


class StreamedData:
    """A training set streamed from the host batch by batch, in the resident feed's plan.

    Attributes:
      batches: the grain pipeline (see :func:`host_batches`) of this process's columns.
      shape: (N, H, W, C) of the images.
      batch_shape: (this process's columns of a global batch, H, W, C).
      steps_per_epoch: iterations per epoch.
    """

    kind = "stream"

    def __init__(self, data, *, mini_batch_size: int, num_epochs: int, shuffle: str, seed: int,
                 multiprocess: bool = False):
        order = epoch_order(len(data), mini_batch_size, num_epochs, shuffle, seed)
        # A mesh within one process (even among several) needs every column here.
        shard = (grain.sharding.ShardByJaxProcess() if multiprocess
                 else grain.sharding.NoSharding())
        self.data, self.order = data, process_columns(order, shard.shard_index, shard.shard_count)
        self.batches = host_batches(data, self.order)
        self.shape = (len(data), *image_shape(data))
        self.batch_shape = (self.order.shape[1], *self.shape[1:])
        self.steps_per_epoch = steps_per_epoch(len(data), mini_batch_size)
        self._iterator = None

    def start(self, skip: int = 0):
        """An iterator over the plan's host batches (dicts, see :func:`host_batches`) from
        iteration ``skip`` on (a resumed run reads nothing it has trained on)."""
        batches = self.batches if skip == 0 else host_batches(self.data, self.order[skip:])
        self._iterator = iter(batches)
        return self._iterator

    def close(self) -> None:
        """Stop grain's reader threads (training may stop before the plan's end)."""
        if self._iterator is not None and hasattr(self._iterator, "close"):
            self._iterator.close()
