"""Device-resident epochs: the data set lives on every device; only indices are planned.

The host decides once, before training, which samples form every iteration's mini-batch
(seeded, per-epoch permutations; the last partial batch of each epoch dropped, as MATLAB
does). The step gathers its batch from the resident uint8 set, so no image crosses the
host-device link after the first copy.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxflowers.parallel import REPLICATED, DataParallel, sharded


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

    Read in chunks so a memory-mapped set is never turned into floats whole.
    """
    channels = images.shape[-1]
    total, squares, count = np.zeros(channels), np.zeros(channels), 0
    for start in range(0, len(images), chunk):
        block = np.asarray(images[start:start + chunk], dtype=np.float64).reshape(-1, channels)
        total += block.sum(0)
        squares += np.square(block).sum(0)
        count += len(block)
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    return mean.astype(np.float32), np.maximum(std, 1.0).astype(np.float32)


@dataclasses.dataclass
class ResidentData:
    """A training set copied once to every device, plus its iteration plan.

    Attributes:
      images: uint8 (N, H, W, C), replicated on every device.
      labels: int32 (N,), replicated.
      order: int32 (iterations, global batch), each device holding its columns.
      steps_per_epoch: iterations per epoch.
    """

    images: object
    labels: object
    order: object
    steps_per_epoch: int

    @classmethod
    def place(cls, parallel: DataParallel, data, *, mini_batch_size: int, num_epochs: int,
              shuffle: str, seed: int) -> "ResidentData":
        order = epoch_order(len(data), mini_batch_size, num_epochs, shuffle, seed)
        return cls(images=parallel.put(np.asarray(data.images), REPLICATED),
                   labels=parallel.put(np.asarray(data.labels, np.int32), REPLICATED),
                   order=parallel.put(order, sharded(1)),
                   steps_per_epoch=steps_per_epoch(len(data), mini_batch_size))
