"""Device-resident epochs, the iteration plan both feeds share, and the choice between them.

The host decides once, before training, which samples form every iteration's mini-batch
(seeded, per-epoch permutations; the last partial batch of each epoch dropped, as MATLAB
does). A set that fits the device memory budget is resident: the step gathers its batch
from the uint8 set on the device, so no image crosses the host-device link after the
first copy. A larger one streams through grain (:mod:`jaxflowers.data.stream`) in the
same plan, so both feeds train the same numbers.

With several processes (``parallel.initialize``) every process holds the whole host set
and draws the same plan (it is seeded); a resident set is copied to each device of every
process, which then gathers its own columns of each batch, exactly as on one process.
Copying the set to every device is what resident means anyway, so this costs no more
device memory than one host with as many devices; the alternative (each process keeping
only the rows its devices need) would make the gather a cross-host exchange.
"""
from __future__ import annotations

import concurrent.futures
import os
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxflowers.parallel import REPLICATED, DataParallel, sharded

# "auto" keeps a set resident when it takes at most this share of a device's memory: the
# rest is for parameters, optimizer state and activations.
_DEVICE_FRACTION = 0.4
# Devices that report no memory limit (CPU) share the host's memory; this much of it,
# split among them.
_HOST_BUDGET = 8 * 2**30
# Bytes per device the resident set may take, overriding the rule above (tests, tuning).
BUDGET_ENV = "JAXFLOWERS_DEVICE_MEMORY_BUDGET"


class Placement(NamedTuple):
    """Where the training set lives: ``kind`` "resident" or "stream", and why."""

    kind: str
    nbytes: int  # bytes the set takes on every device when resident
    budget: int  # bytes per device "auto" allows

    def describe(self) -> str:
        where = "resident on every device" if self.kind == "resident" else "streamed from host"
        return f"data {where} ({_size(self.nbytes)}, budget {_size(self.budget)} per device)"


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def choose_placement(requested: str, data, devices) -> Placement:
    """Resolve ``TrainingOptions.data_placement`` for ``data`` on ``devices``.

    Args:
      requested: "resident", "stream", or "auto" (resident when the uint8 images and
        int32 labels fit :func:`device_memory_budget`, else stream).
      data: an image set with ``images`` (N, H, W, C) uint8 (only its shape is used: a
        memory map is not read, a folder's subset not gathered).
      devices: this process's devices the set would be replicated on.

    Returns:
      A :class:`Placement`.
    """
    nbytes = len(data) * (int(np.prod(image_shape(data))) + 4)
    budget = device_memory_budget(devices)
    kind = requested
    if requested == "auto":
        kind = "resident" if nbytes <= budget else "stream"
    return Placement(kind, nbytes, budget)


def image_shape(data) -> tuple[int, ...]:
    """(H, W, C) of an image set's images, without reading (or gathering) them when the set
    knows it (``ImageSet`` and ``ImageFolder`` have ``image_shape``)."""
    shape = getattr(data, "image_shape", None)
    return tuple(shape) if shape is not None else tuple(data.images.shape[1:])


def device_memory_budget(devices) -> int:
    """Bytes of each device's memory a resident training set may take.

    ``$JAXFLOWERS_DEVICE_MEMORY_BUDGET`` if set; else 40% of the smallest device memory
    limit (``memory_stats()["bytes_limit"]``); else 8 GiB of host memory split among the
    devices (CPU devices report no limit and hold one copy each in the same RAM).
    """
    override = os.environ.get(BUDGET_ENV)
    if override:
        return int(override)
    limits = [_bytes_limit(d) for d in devices]
    if all(limits):
        return int(_DEVICE_FRACTION * min(limits))
    return _HOST_BUDGET // len(devices)


def _bytes_limit(device) -> int | None:
    try:
        stats = device.memory_stats()
    except Exception:  # backends without memory statistics raise rather than return None
        return None
    return (stats or {}).get("bytes_limit")


def steps_per_epoch(num_samples: int, mini_batch_size: int) -> int:
    """Whole mini-batches in one epoch (the partial last one is dropped)."""
    return num_samples // mini_batch_size


def epoch_order(num_samples: int, mini_batch_size: int, num_epochs: int, shuffle: str,
                seed: int) -> np.ndarray:
    """int32 (num_epochs * steps_per_epoch, mini_batch_size): sample indices per iteration.

    ``shuffle``: "once" draws one permutation for all epochs, "every-epoch" a new one per
    epoch, "never" keeps the data order. The plan depends only on the arguments, not on
    the number of devices, so 1 and N devices see the same global batches.
    """
    steps = steps_per_epoch(num_samples, mini_batch_size)
    rng = np.random.default_rng(seed)
    once = rng.permutation(num_samples) if shuffle == "once" else np.arange(num_samples)
    epochs = []
    for _ in range(num_epochs):
        perm = rng.permutation(num_samples) if shuffle == "every-epoch" else once
        epochs.append(perm[:steps * mini_batch_size].reshape(steps, mini_batch_size))
    return np.concatenate(epochs).astype(np.int32)


def channel_stats(images: np.ndarray, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation (float32 (C,)) of uint8 (N, H, W, C) images.

    Read in chunks so a memory-mapped set is never turned into floats whole. (A resident
    set is measured on its devices instead: ``ResidentData.channel_stats``.)
    """
    channels = images.shape[-1]
    total, squares, count = np.zeros(channels), np.zeros(channels), 0
    for start in range(0, len(images), chunk):
        block = np.asarray(images[start:start + chunk], dtype=np.float64).reshape(-1, channels)
        total += block.sum(0)
        squares += np.square(block).sum(0)
        count += len(block)
    return _stats_from_moments(total, squares, count)


def _stats_from_moments(total, squares, count: int) -> tuple[np.ndarray, np.ndarray]:
    mean = np.asarray(total, np.float64) / count
    std = np.sqrt(np.maximum(np.asarray(squares, np.float64) / count - mean**2, 0.0))
    return mean.astype(np.float32), np.maximum(std, 1.0).astype(np.float32)


def _row_moments(images):
    """Per-device: int32 sums of pixel values and of their squares along every image row,
    (N, H, C) each. Exact (a row of up to 33,000 pixels fits in int32) and so independent
    of the reduction order and of the device count."""
    x = images.astype(jnp.int32)
    return x.sum(axis=2), (x * x).sum(axis=2)


class ResidentData:
    """A training set copied once to every device, plus its iteration plan.

    The copy runs in a background thread from ``place`` on: compiling needs only the set's
    shape, so the two overlap (a process's first copy to an H200 takes ~1.8 s whatever its
    size, then Flowers' 500 MB take 0.3 s; benchmarks/NOTES.md, session 5). Whatever reads
    the arrays waits for the copy, and re-raises its error.

    Attributes:
      parallel: the devices it lives on.
      images: uint8 (N, H, W, C), replicated on every device.
      labels: int32 (N,), replicated.
      order: int32 (iterations, global batch), each device holding its columns.
      shape, order_shape: the images' and the order's shapes (known before the copy ends).
      steps_per_epoch: iterations per epoch.
    """

    def __init__(self, parallel: DataParallel, copy: concurrent.futures.Future, shape,
                 order_shape, steps: int):
        self.parallel, self._copy, self.shape = parallel, copy, tuple(shape)
        self.order_shape, self.steps_per_epoch = tuple(order_shape), steps
        self._compiled = None
        self._limit: tuple = (None, None)

    @property
    def images(self):
        return self._copy.result()[0]

    @property
    def labels(self):
        return self._copy.result()[1]

    @property
    def order(self):
        return self._copy.result()[2]

    @classmethod
    def place(cls, parallel: DataParallel, data, *, mini_batch_size: int, num_epochs: int,
              shuffle: str, seed: int) -> "ResidentData":
        """Plan the epochs and start copying ``data`` (its ``images`` are read, a folder's
        subset gathered, in the background too)."""
        order = epoch_order(len(data), mini_batch_size, num_epochs, shuffle, seed)

        def copy():  # the plan too: a process's first copy to a GPU takes ~1.8 s, any size
            return (parallel.put(np.asarray(data.images), REPLICATED),
                    parallel.put(np.asarray(data.labels, np.int32), REPLICATED),
                    parallel.put(order, sharded(1)))

        worker = concurrent.futures.ThreadPoolExecutor(1, "jaxflowers-copy")
        try:
            started = worker.submit(copy)
        finally:
            worker.shutdown(wait=False)
        return cls(parallel, started, (len(data), *image_shape(data)), order.shape,
                   steps_per_epoch(len(data), mini_batch_size))

    def lower(self, block_fn: Callable, state, stats):
        """The per-device ``block_fn(state, images, labels, order, stats, limit)`` traced, not
        yet compiled (``jax.stages.Lowered``); ``state`` and ``stats`` may be
        ``jax.ShapeDtypeStruct``s (``DataParallel.abstract``). Does not wait for the copy."""
        specs = (REPLICATED, REPLICATED, REPLICATED, sharded(1), REPLICATED, REPLICATED)
        fn = self.parallel.wrap(block_fn, specs, (REPLICATED, REPLICATED), donate_argnums=(0,))
        images, labels, limit = self.parallel.abstract((
            jax.ShapeDtypeStruct(self.shape, np.uint8),
            jax.ShapeDtypeStruct(self.shape[:1], np.int32), jax.ShapeDtypeStruct((), np.int32)))
        order = self.parallel.abstract(jax.ShapeDtypeStruct(self.order_shape, np.int32),
                                       sharded(1))
        return fn.lower(state, images, labels, order, stats, limit)

    def use(self, compiled) -> Callable:
        """From the compiled ``lower``: ``run(state, stats, limit) -> (state, metrics)``, one
        dispatch of the block, stopping at iteration ``limit`` (an int)."""
        self._compiled = compiled
        return self._run

    def channel_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """``channel_stats`` of the resident images, reduced where they already are.

        The devices sum each image row in integers; the host adds those (N x H x C) sums
        in int64. The same numbers as the host function, without the host reading the
        whole set as floats (about 10 s for Flowers' 3,303 training images at 224 x 224 on
        two cores; milliseconds on a GPU).
        """
        fn = self.parallel.wrap(_row_moments, (REPLICATED,), (REPLICATED, REPLICATED))
        sums, squares = self.parallel.get(fn(self.images))
        count = sums.shape[0] * sums.shape[1] * self.shape[-2]  # N * H * W
        return _stats_from_moments(sums.sum((0, 1), dtype=np.int64),
                                   squares.sum((0, 1), dtype=np.int64), count)

    def _run(self, state, stats, limit: int):
        if limit != self._limit[0]:  # one small copy per sync interval, not per dispatch
            self._limit = (limit, self.parallel.put(np.int32(limit)))
        return self._compiled(state, self.images, self.labels, self.order, stats,
                              self._limit[1])

    def close(self) -> None:
        """Let the copy finish (training may end early, on an error among others), so no
        thread outlives ``train``; its own error was raised to whoever read the arrays."""
        concurrent.futures.wait([self._copy])
