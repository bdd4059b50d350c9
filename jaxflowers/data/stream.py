"""Streamed epochs for sets that don't fit on the devices: grain reads uint8 batches ahead.

The plan is the resident feed's (:func:`~jaxflowers.data.loader.epoch_order`): the same
seeded permutations, the same dropped partial batches, so the same seed trains the same
numbers either way. Each plan row (one global mini-batch) becomes one grain element: the
rows of the (memory-mapped) images and labels it names, gathered on the host. Augmentation
and normalisation stay on the device, in the same step as resident training.

Read-ahead uses grain's threads (``to_iter_dataset(ReadOptions(...))``), not its worker
processes: the per-batch host work is one gather (a memory copy, which numpy does without
the GIL), and ``mp_prefetch`` would pickle the images into every worker (a memory map is
pickled as a full copy), needs absl flags marked parsed in grain 0.2.18
(``UnparsedFlagAccessError`` otherwise; the thread path reads none), and took 7 s to start
two workers here.

With several JAX processes (``parallel.initialize``) each one reads only its columns of
every global batch (``grain.sharding.ShardByJaxProcess``: process p the p-th 1/P), and
``DataParallel.put_process_local`` assembles the global batch from those shares, which
the mesh lays out process by process. Every process plans the same epochs (the plan is
seeded), so the global batches, and the numbers, are those of one process.
"""
from __future__ import annotations

import os
from typing import Callable

import grain
import numpy as np

from jaxflowers.data.loader import epoch_order, steps_per_epoch
from jaxflowers.parallel import REPLICATED, DataParallel, sharded

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
    """A training set streamed from the host, one batch placed ahead of the devices.

    The feed of ``train`` for sets over the device memory budget; same interface as
    :class:`~jaxflowers.data.loader.ResidentData` (``steps_per_epoch``, ``lower``, ``use``,
    ``close``).

    Attributes:
      batches: the grain pipeline (see :func:`host_batches`) of this process's columns.
      steps_per_epoch: iterations per epoch.
    """

    def __init__(self, parallel: DataParallel, batches: grain.IterDataset, steps: int):
        self.parallel, self.batches, self.steps_per_epoch = parallel, batches, steps
        self._iterator = self._next = self._compiled = None

    @classmethod
    def place(cls, parallel: DataParallel, data, *, mini_batch_size: int, num_epochs: int,
              shuffle: str, seed: int) -> "StreamedData":
        """Plan the epochs as the resident feed does; nothing is read until ``lower``."""
        order = epoch_order(len(data), mini_batch_size, num_epochs, shuffle, seed)
        # A mesh within one process (even among several) needs every column here.
        shard = (grain.sharding.ShardByJaxProcess() if parallel.multiprocess
                 else grain.sharding.NoSharding())
        order = process_columns(order, shard.shard_index, shard.shard_count)
        return cls(parallel, host_batches(data, order),
                   steps_per_epoch(len(data), mini_batch_size))

    def lower(self, step_fn: Callable, state, stats):
        """The per-device ``step_fn(state, images, labels, stats)`` traced for the first batch,
        which it places (``jax.stages.Lowered``); ``state`` and ``stats`` may be
        ``jax.ShapeDtypeStruct``s."""
        specs = (REPLICATED, sharded(0), sharded(0), REPLICATED)
        fn = self.parallel.wrap(step_fn, specs, (REPLICATED, REPLICATED), donate_argnums=(0,))
        self._iterator = iter(self.batches)
        self._next = self._place_next()
        return fn.lower(state, *self._next, stats)

    def use(self, compiled) -> Callable:
        """From the compiled ``lower``: ``run(state, stats, limit) -> (state, metrics)``, one
        iteration on the next batch (``limit`` is unused: one iteration per dispatch never
        overshoots it)."""
        self._compiled = compiled
        return self._run

    def _run(self, state, stats, limit: int):
        del limit
        images, labels = self._next
        state, metrics = self._compiled(state, images, labels, stats)  # asynchronous
        # Read and copy batch n+1 while the devices run batch n: nothing has waited on
        # batch n's results yet, so the copy overlaps its compute.
        self._next = self._place_next()
        return state, metrics

    def _place_next(self):
        batch = next(self._iterator, None)  # None after the plan's last batch
        if batch is None:
            return None
        return self.parallel.put_process_local((batch["images"], batch["labels"]), sharded(0))

    def close(self) -> None:
        """Stop grain's reader threads (training may stop before the plan's end)."""
        if self._iterator is not None and hasattr(self._iterator, "close"):
            self._iterator.close()
