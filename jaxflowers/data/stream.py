"""Streamed epochs for sets that don't fit on the devices: grain reads uint8 batches ahead.

Same plan as the resident feed (:func:`~jaxflowers.data.feed.epoch_order`); each row, one global
batch, is gathered on the host by grain's threads (numpy copies without the GIL; worker
processes would each get a pickled copy of the images). Each JAX process reads its columns.
"""
from __future__ import annotations

import os

import grain
import numpy as np

from jaxflowers.data.feed import epoch_order, image_shape, read_rows, steps_per_epoch

__all__ = ["PREFETCH_BATCHES", "StreamedData", "host_batches", "process_columns"]

# Batches grain keeps ready on the host: enough to ride out a slow read (page faults of a
# memory map on a cold disk) without holding much memory.
PREFETCH_BATCHES = 8


def process_columns(order: np.ndarray, shard_index: int, shard_count: int) -> np.ndarray:
    """int (iterations, global batch / shard_count): this process's columns of ``order``."""
    width, rest = divmod(order.shape[1], shard_count)
    if rest:
        raise ValueError(f"mini_batch_size={order.shape[1]} is not divisible by "
                         f"{shard_count} processes")
    return order[:, shard_index * width:(shard_index + 1) * width]


def host_batches(data, order: np.ndarray, *, num_threads: int | None = None,
                 prefetch: int = PREFETCH_BATCHES) -> grain.IterDataset:
    """A grain pipeline of ``data``'s batches, one per row of ``order`` (int (iterations, b)).

    Returns an ``IterDataset`` of ``{"index": int32 (b,), "images": uint8 (b, H, W, C), "labels":
    int32 (b,)}`` read ahead by ``num_threads`` (default ``min(8, cpu_count)``) threads.
    """
    labels = np.asarray(data.labels, np.int32)
    shape = image_shape(data)

    def gather(index):
        # Read in ascending order (sequential for a memory map on disk), then put back.
        ascending = np.argsort(index, kind="stable")
        batch = np.empty((len(index), *shape), np.uint8)
        batch[ascending] = read_rows(data, index[ascending])
        return {"index": index, "images": batch, "labels": labels[index]}

    threads = num_threads or min(8, os.cpu_count() or 1)
    return (grain.MapDataset.source(np.asarray(order, np.int32)).map(gather)
            .to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch)))


class StreamedData:
    """A training set streamed from the host batch by batch, in the resident feed's plan.

    Attributes:
      batches: the grain pipeline (see :func:`host_batches`) of this process's columns.
      batch_shape: (this process's columns of a global batch, H, W, C).
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
        """An iterator over the plan's host batches from iteration ``skip`` on (resuming)."""
        batches = self.batches if skip == 0 else host_batches(self.data, self.order[skip:])
        self._iterator = iter(batches)
        return self._iterator

    def close(self) -> None:
        """Stop grain's reader threads (training may stop before the plan's end) and wait for
        each to finish the batch it is reading, so none outlives the run."""
        if self._iterator is None:
            return
        # grain's own close cancels the batches not yet begun but leaves its pool's threads to
        # end in their own time; the pool (a ThreadPoolExecutor) is where they can be joined.
        readers = getattr(self._iterator, "_executor", None)
        if hasattr(self._iterator, "close"):
            self._iterator.close()
        if readers is not None and hasattr(readers, "shutdown"):
            readers.shutdown(wait=True)
