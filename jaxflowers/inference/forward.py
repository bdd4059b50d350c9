"""The compiled, sharded forward pass that validation and ``predict`` share."""
from __future__ import annotations

import functools

import jax
import numpy as np
from jax import lax

from jaxflowers.data.augment import normalize
from jaxflowers.parallel.data_parallel import REPLICATED, DataParallel, sharded

__all__ = ["ForwardPass"]


def _logits(variables, images, stats, *, model, dtype, batch: int):
    """Per-device logits (m, C) float32 for (m, H, W, C) uint8 images, ``batch`` at a time."""
    def one(x):
        return model.apply(variables, normalize(x, stats[0], stats[1], dtype), train=False)

    blocks = images.reshape(images.shape[0] // batch, batch, *images.shape[1:])
    logits = lax.map(one, blocks)
    return logits.reshape(images.shape[0], -1)


@functools.lru_cache(maxsize=8)
def _forward_program(parallel: DataParallel, model, dtype, batch: int):
    """One jitted pass per configuration, so ``predict`` after ``train`` reuses validation's."""
    forward = functools.partial(_logits, model=model, dtype=dtype, batch=batch)
    return parallel.wrap(forward, (REPLICATED, sharded(0), REPLICATED), sharded(0))


class ForwardPass:
    """Compiled, sharded passes of ``model`` in ``dtype``, ``per_device_batch`` images at a time."""

    def __init__(self, parallel: DataParallel, model, dtype, per_device_batch: int):
        self.parallel, self.model, self.dtype = parallel, model, dtype
        self.per_device_batch = per_device_batch
        self._compiled: dict[int, object] = {}

    def place(self, images: np.ndarray):
        """Pad (n, H, W, C) uint8 images to whole device batches and shard them."""
        # Invariant: padding is cut off after (fetch), so every sample counts exactly once.
        n, (padded, batch) = len(images), self._layout(len(images))
        images = np.asarray(images)
        if padded > n:
            images = np.concatenate([images, np.zeros((padded - n, *images.shape[1:]), np.uint8)])
        return self.parallel.put(images, sharded(0)), n, batch

    def abstract(self, n: int, image_shape):
        """What ``place`` returns for ``n`` images of ``image_shape``, as shapes (to compile)."""
        padded, batch = self._layout(n)
        images = jax.ShapeDtypeStruct((padded, *image_shape), np.uint8)
        return self.parallel.abstract(images, sharded(0)), n, batch

    def _layout(self, n: int) -> tuple[int, int]:
        """(padded count, per-device batch) for ``n`` images (at least one device batch)."""
        devices = self.parallel.num_devices
        batch = max(1, min(self.per_device_batch, -(-n // devices)))
        return max(1, -(-n // (devices * batch))) * devices * batch, batch

    def logits(self, variables, placed, stats) -> np.ndarray:
        """float32 (n, C) logits; ``variables`` and ``stats`` already placed replicated."""
        return self.fetch(self.start(variables, placed, stats))

    def compile(self, variables, placed, stats) -> None:
        """Compile ahead of the first ``start``; the arguments may be shapes (``abstract``)."""
        images, _, batch = placed
        self._compiled[batch] = self._function(batch).lower(variables, images, stats).compile()

    def start(self, variables, placed, stats):
        """Dispatch the forward pass and return a handle for ``fetch`` at once."""
        images, n, batch = placed
        if batch not in self._compiled:
            self._compiled[batch] = self._function(batch)  # compiled on its first call
        return self._compiled[batch](variables, images, stats), n

    def _function(self, batch: int):
        key = (self.parallel, self.model, self.dtype, batch)
        try:
            hash(key)
        except TypeError:  # a module that cannot be a key: a program of its own
            return _forward_program.__wrapped__(*key)
        return _forward_program(*key)

    def fetch(self, handle) -> np.ndarray:
        """The float32 (n, C) logits of a ``start``; waits for that pass only."""
        logits, n = handle
        return self.parallel.get(logits, sharded(0))[:n]
