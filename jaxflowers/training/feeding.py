"""Feeding the training program: the training set and channel statistics placed on the devices,
and the runners that hand each dispatch its data (resident, or the next streamed batch)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxflowers.data.feed import ResidentData
from jaxflowers.data.moments import channel_stats, stats_from_moments
from jaxflowers.parallel.data_parallel import REPLICATED, DataParallel, sharded

__all__ = ["place", "runner"]


def place(parallel: DataParallel, feed, start: int, normalization=None):
    """(placed arrays or the batch iterator, placed channel statistics, their host copy);
    ``normalization``: fixed (mean, std) instead of the data's (a pretrained network's)."""
    if isinstance(feed, ResidentData):
        images, labels = feed.host_arrays()
        arrays = (parallel.put(images), parallel.put(labels))
        if normalization is None:
            normalization = _resident_stats(parallel, feed, arrays[0])
    else:
        arrays = feed.start(start)
        if normalization is None:
            normalization = channel_stats(feed.data)  # read in chunks: the set may not fit
    normalization = tuple(np.asarray(s, np.float32) for s in normalization)
    return arrays, parallel.put(normalization), normalization


def _resident_stats(parallel: DataParallel, feed, images) -> tuple[np.ndarray, np.ndarray]:
    """``channel_stats`` of the resident images, summed on the devices in exact integers."""
    fn = parallel.wrap(_row_moments, (REPLICATED,), (REPLICATED, REPLICATED))
    sums, squares = parallel.get(fn(images))
    count = sums.shape[0] * sums.shape[1] * feed.shape[2]  # N * H * W
    return stats_from_moments(sums.sum((0, 1), dtype=np.int64),
                              squares.sum((0, 1), dtype=np.int64), count)


def _row_moments(images):
    """Per device: int32 (N, H, C) sums of pixel values and of their squares along each row."""
    # Exact: a row of up to 33,000 uint8 pixels' squares fits in int32.
    x = images.astype(jnp.int32)
    return x.sum(axis=2), (x * x).sum(axis=2)


def runner(parallel: DataParallel, feed, compiled, arrays, stats, hyper, block_length: int):
    """``run(state, first, limit) -> (state, metrics)``: one dispatch of the compiled block,
    from iteration ``first`` (the state's step); ``hyper``: the placed hyperparameters."""
    if isinstance(feed, ResidentData):
        return _ResidentRunner(parallel, feed, compiled, arrays, (stats, hyper), block_length)
    return _StreamedRunner(parallel, compiled, arrays, (stats, hyper))


class _ResidentRunner:
    """One dispatch of the resident block: ``run(state, first, limit) -> (state, metrics)``."""

    def __init__(self, parallel: DataParallel, feed: ResidentData, compiled, arrays, fixed,
                 block_length: int):
        self.parallel, self.compiled, self.arrays, self.fixed = parallel, compiled, arrays, fixed
        self.feed, self.rows = feed, feed.window_rows(block_length)
        self._limit: tuple = (None, None)
        self._window: tuple = (None, ())  # (epoch, its placed plan rows and first iteration)

    def __call__(self, state, first: int, limit: int):
        if limit != self._limit[0]:  # one small copy per sync interval, not per dispatch
            self._limit = (limit, self.parallel.put(np.int32(limit)))
        epoch = first // self.feed.steps_per_epoch
        if epoch != self._window[0]:  # and one per epoch
            rows, offset = self.feed.window(epoch, self.rows)
            self._window = (epoch, (self.parallel.put(rows, sharded(1)),
                                    self.parallel.put(np.int32(offset))))
        return self.compiled(state, *self.arrays, *self._window[1], *self.fixed, self._limit[1])


class _StreamedRunner:
    """One iteration on the next streamed batch, the batch after it placed ahead."""

    def __init__(self, parallel: DataParallel, compiled, batches, fixed):
        self.parallel, self.compiled, self.fixed = parallel, compiled, fixed
        self._batches = batches
        self._next = self._place_next()

    def __call__(self, state, first: int, limit: int):
        del first, limit  # one iteration per dispatch never overshoots the limit
        images, labels = self._next
        state, metrics = self.compiled(state, images, labels, *self.fixed)  # asynchronous
        # Read and copy batch n+1 while the devices run batch n.
        self._next = self._place_next()
        return state, metrics

    def _place_next(self):
        batch = next(self._batches, None)  # None after the plan's last batch
        if batch is None:
            return None
        return self.parallel.put_process_local((batch["images"], batch["labels"]), sharded(0))
