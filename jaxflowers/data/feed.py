"""The iteration plan both feeds share, the resident feed, and the choice between feeds.

The host draws every batch once (seeded; an epoch's partial last batch dropped, as MATLAB
does), so the resident feed and the streamed one (:mod:`jaxflowers.data.stream`) train the same
numbers. Feeds supply host arrays (``TrainProgram`` places them); every process draws the plan.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from jaxflowers.data.mapped import take_rows

__all__ = ["BUDGET_ENV", "Placement", "ResidentData", "choose_placement",
           "device_memory_budget", "epoch_order", "image_shape", "read_rows", "steps_per_epoch",
           "stored_rows"]

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
    """Resolve ``TrainingOptions.data_placement`` ("resident", "stream" or "auto") for ``data``.

    "auto" is resident if the uint8 images (only their shape is read) fit
    :func:`device_memory_budget` of ``devices``, this process's devices.
    """
    nbytes = len(data) * (int(np.prod(image_shape(data))) + 4)
    budget = device_memory_budget(devices)
    kind = requested
    if requested == "auto":
        kind = "resident" if nbytes <= budget else "stream"
    return Placement(kind, nbytes, budget)


def image_shape(data) -> tuple[int, ...]:
    """(H, W, C) of an image set's images, without reading them where the set knows it."""
    shape = getattr(data, "image_shape", None)
    return tuple(shape) if shape is not None else tuple(data.images.shape[1:])


def device_memory_budget(devices) -> int:
    """Bytes per device a resident set may take: ``$JAXFLOWERS_DEVICE_MEMORY_BUDGET``, else
    a share of the smallest device's memory limit, else a host budget split among devices."""
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

    ``shuffle`` is "once", "every-epoch" or "never"; the plan does not depend on the device count.
    """
    steps = steps_per_epoch(num_samples, mini_batch_size)
    rng = np.random.default_rng(seed)
    once = rng.permutation(num_samples) if shuffle == "once" else np.arange(num_samples)
    epochs = []
    for _ in range(num_epochs):
        perm = rng.permutation(num_samples) if shuffle == "every-epoch" else once
        epochs.append(perm[:steps * mini_batch_size].reshape(steps, mini_batch_size))
    return np.concatenate(epochs).astype(np.int32)


def read_rows(data, index) -> np.ndarray:
    """uint8 (len(index), H, W, C): the images of a set (or an array) at ``index``, read alone
    where the set can (``ImageFolder.read``: from its resize cache on disk), so a set larger
    than memory is never loaded whole; a memory map's rows are read ahead
    (:func:`~jaxflowers.data.mapped.take_rows`)."""
    if isinstance(data, np.ndarray):
        return take_rows(data, index)
    reader = getattr(data, "read", None)
    return np.asarray(reader(index)) if reader is not None else take_rows(data.images, index)


def stored_rows(data, kind: str) -> np.ndarray | None:
    """What a set stores of each of its images, ``data.row_<kind>()`` (an ``ImageFolder``'s
    resize cache: ``moments``, ``digests``), or None where it stores nothing."""
    method = getattr(data, f"row_{kind}", None)
    return method() if callable(method) else None


class ResidentData:
    """A training set copied once to every device, and its iteration plan.

    Attributes:
      data, shape: the image set (read by ``host_arrays``) and its (N, H, W, C).
      order: int32 (iterations, global batch) sample indices per iteration.
    """

    kind = "resident"

    def __init__(self, data, *, mini_batch_size: int, num_epochs: int, shuffle: str, seed: int):
        self.data = data
        self.order = epoch_order(len(data), mini_batch_size, num_epochs, shuffle, seed)
        self.shape = (len(data), *image_shape(data))
        self.steps_per_epoch = steps_per_epoch(len(data), mini_batch_size)

    def host_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(images uint8 (N, H, W, C), labels int32 (N,)), read from the set."""
        return np.asarray(self.data.images), np.asarray(self.data.labels, np.int32)

    def window_rows(self, block_length: int) -> int:
        """Rows of ``window`` that a dispatch of ``block_length`` iterations needs: from the
        first iteration of the epoch it starts in to its own last."""
        return self.steps_per_epoch + block_length - 1

    def window(self, epoch: int, rows: int) -> tuple[np.ndarray, int]:
        """``rows`` rows of ``order`` from the first iteration of ``epoch`` (zeros past the
        plan's end) and that iteration: what a dispatch starting in ``epoch`` indexes, of a
        shape that does not grow with the number of epochs."""
        first = epoch * self.steps_per_epoch
        window = np.zeros((rows, self.order.shape[1]), np.int32)
        part = self.order[first:first + rows]
        window[:len(part)] = part
        return window, first

    def close(self) -> None:
        """Nothing to release (the streamed feed stops its readers here)."""
