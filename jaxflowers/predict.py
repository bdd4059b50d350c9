"""Prediction split over every device, exact for any sample count, and its scoring.

Samples are padded up to a whole number of per-device batches and the padding is cut off
afterwards, so every sample is counted exactly once: nothing dropped, nothing duplicated.
With several processes the padded set is split over the devices of all of them and the
logits are gathered back (``DataParallel.get``), so every process returns every score.
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import numpy as np
from jax import lax

from jaxflowers.data.augment import normalize
from jaxflowers.options import PARAMETER_LAYOUTS
from jaxflowers.parallel import REPLICATED, DataParallel, select_devices, sharded
from jaxflowers.step import FlatParams, uses_flat_layout


def _forward(variables, images, stats, *, model, dtype, batch: int, layout=None):
    """Per-device logits (m, C) float32 for (m, H, W, C) uint8 images, ``batch`` at a time."""
    if layout is not None:
        variables = layout.unpack(variables)

    def one(x):
        return model.apply(variables, normalize(x, stats[0], stats[1], dtype), train=False)

    blocks = images.reshape(images.shape[0] // batch, batch, *images.shape[1:])
    logits = lax.map(one, blocks)
    return logits.reshape(images.shape[0], -1)


@functools.lru_cache(maxsize=8)
def _forward_program(parallel: DataParallel, model, dtype, batch: int, layout):
    """The sharded forward pass: one jitted function per configuration in a process, so a
    pass traced and compiled once (``train``'s validation) is reused by the next
    ``Predictor`` (``predict`` after ``train``: no trace, no lowering, no compile)."""
    forward = functools.partial(_forward, model=model, dtype=dtype, batch=batch, layout=layout)
    return parallel.wrap(forward, (REPLICATED, sharded(0), REPLICATED), sharded(0))


class Predictor:
    """Compiled, sharded forward passes of one model on one set of devices.

    Args:
      parallel: the devices and strategy.
      model: a flax module taking ``train=False``.
      dtype: compute dtype.
      per_device_batch: most images a device processes at once.
      layout: the parameters arrive as one vector in this ``FlatParams`` layout and are
        unpacked inside the compiled pass (``train`` validates from its flat parameter
        vector this way), or None: as the model's tree.
    """

    def __init__(self, parallel: DataParallel, model, dtype, per_device_batch: int,
                 layout: FlatParams | None = None):
        self.parallel, self.model, self.dtype = parallel, model, dtype
        self.per_device_batch, self.layout = per_device_batch, layout
        self._compiled: dict[int, object] = {}

    def place(self, images: np.ndarray):
        """Pad (n, H, W, C) uint8 images to whole device batches and shard them."""
        n, (padded, batch) = len(images), self._layout(len(images))
        images = np.asarray(images)
        if padded > n:
            images = np.concatenate([images, np.zeros((padded - n, *images.shape[1:]), np.uint8)])
        return self.parallel.put(images, sharded(0)), n, batch

    def abstract(self, n: int, image_shape):
        """What ``place`` returns for ``n`` images of ``image_shape``, as shapes: enough to
        ``compile`` before the images are placed."""
        padded, batch = self._layout(n)
        images = jax.ShapeDtypeStruct((padded, *image_shape), np.uint8)
        return self.parallel.abstract(images, sharded(0)), n, batch

    def _layout(self, n: int) -> tuple[int, int]:
        """(padded count, per-device batch) for ``n`` images."""
        devices = self.parallel.num_devices
        batch = max(1, min(self.per_device_batch, -(-n // devices)))
        return -(-n // (devices * batch)) * devices * batch, batch

    def logits(self, variables, placed, stats) -> np.ndarray:
        """float32 (n, C) logits; ``variables`` and ``stats`` already placed replicated."""
        return self.fetch(self.start(variables, placed, stats))

    def compile(self, variables, placed, stats) -> None:
        """Compile the pass for ``placed`` ahead of its first ``start``; ``variables``,
        ``placed`` (``abstract``) and ``stats`` may be shapes (``DataParallel.abstract``)."""
        images, _, batch = placed
        self._compiled[batch] = self._function(batch).lower(variables, images, stats).compile()

    def start(self, variables, placed, stats):
        """Dispatch the forward pass and return at once (a handle for ``fetch``): the
        devices run it in order with whatever is dispatched next."""
        images, n, batch = placed
        if batch not in self._compiled:
            self._compiled[batch] = self._function(batch)  # compiled on its first call
        return self._compiled[batch](variables, images, stats), n

    def _function(self, batch: int):
        key = (self.parallel, self.model, self.dtype, batch, self.layout)
        try:
            hash(key)
        except TypeError:  # a module that cannot be a key: a program of its own
            return _forward_program.__wrapped__(*key)
        return _forward_program(*key)

    def fetch(self, handle) -> np.ndarray:
        """The float32 (n, C) logits of a ``start``; waits for that pass only."""
        logits, n = handle
        return self.parallel.get(logits, sharded(0))[:n]


def predict(net, data, *, mini_batch_size: int = 128, execution_environment: str = "auto",
            num_devices: int | None = None, strategy: str = "shard_map",
            parameter_layout: str = "auto") -> np.ndarray:
    """Class scores for every image, split over the devices (``minibatchpredict``).

    Args:
      net: a ``TrainedNet`` from ``train``.
      data: an image set (anything with ``images``) or a uint8 array (n, H, W, C).
      mini_batch_size: images per device per forward pass.
      execution_environment, num_devices, strategy: which devices, as in TrainingOptions.
      parameter_layout: how the parameters reach the compiled pass, as in TrainingOptions
        ("auto": one vector on GPUs). The scores do not depend on it.

    Returns:
      float32 (n, num_classes) softmax scores, row i for image i; (0, num_classes) for no
      images. With several processes
      (``parallel.initialize``) every process calls it with the same images and receives
      all the scores.
    """
    images = np.asarray(getattr(data, "images", data))
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"predict needs uint8 images (n, H, W, C); got {images.dtype} "
                         f"{images.shape}")
    if images.shape[1:] != tuple(net.input_shape):
        raise ValueError(f"predict: images are {images.shape[1:]} but the network was trained "
                         f"on {tuple(net.input_shape)}")
    if parameter_layout not in PARAMETER_LAYOUTS:
        raise ValueError(f"predict: parameter_layout must be one of {PARAMETER_LAYOUTS}; got "
                         f"{parameter_layout!r}")
    if len(images) == 0:  # nothing to split over the devices; no program to compile
        return np.zeros((0, len(net.class_names)), np.float32)
    parallel = DataParallel(select_devices(execution_environment, num_devices), strategy)
    variables, layout = net.variables, None
    if uses_flat_layout(parameter_layout, parallel.devices[0].platform):
        # Handed over as training validated: right after ``train`` (same devices, batch and
        # images) this pass is its validation pass, already traced and compiled.
        layout = FlatParams.of(variables["params"])
        variables = {**variables, "params": layout.ravel(variables["params"], np)}
    predictor = Predictor(parallel, net.model, net.dtype, mini_batch_size, layout)
    variables = parallel.put(variables)
    stats = parallel.put(tuple(np.asarray(s, np.float32) for s in net.normalization))
    logits = predictor.logits(variables, predictor.place(images), stats)
    # On the host: the logits are here already, and an eager softmax on the devices compiled
    # five small programs in every run (0.3 s on an H200 host).
    return np.exp(log_softmax(logits)).astype(np.float32)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of (n, C) logits, along the last axis, on the host."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class Labels(np.ndarray):
    """A string array of class names that remembers all the class names (a categorical)."""

    class_names: tuple[str, ...] = ()

    def __new__(cls, codes, class_names: Sequence[str]):
        names = np.asarray(class_names, dtype=str)
        obj = names[np.asarray(codes, dtype=np.int64)].view(cls)
        obj.class_names = tuple(str(c) for c in class_names)
        return obj

    def __array_finalize__(self, obj):
        self.class_names = getattr(obj, "class_names", ())

    @property
    def codes(self) -> np.ndarray:
        """int64 indices into ``class_names``."""
        return _codes(np.asarray(self), self.class_names)


def scores_to_labels(scores: np.ndarray, class_names: Sequence[str]) -> Labels:
    """The highest-scoring class name of each row (``scores2label``)."""
    scores = np.asarray(scores)
    if scores.ndim != 2 or scores.shape[1] != len(class_names):
        raise ValueError(f"scores of shape {scores.shape} do not match {len(class_names)} "
                         "class names")
    return Labels(np.argmax(scores, axis=1), class_names)


def classify(net, data, **kwargs) -> tuple[Labels, np.ndarray]:
    """Predicted labels and scores (``classify``); keyword arguments as ``predict``."""
    scores = predict(net, data, **kwargs)
    return scores_to_labels(scores, net.class_names), scores


def accuracy(predicted, true, class_names: Sequence[str] | None = None) -> float:
    """Fraction of ``predicted`` equal to ``true`` (names or integer labels, mixed allowed)."""
    names = _names(class_names, predicted, true)
    predicted, true = _codes(predicted, names), _codes(true, names)
    if predicted.shape != true.shape or predicted.size == 0:
        raise ValueError(f"accuracy needs two non-empty label arrays of one shape; got "
                         f"{predicted.shape} and {true.shape}")
    return float(np.mean(predicted == true))


def confusion_matrix(true, predicted, class_names: Sequence[str] | None = None,
                     num_classes: int | None = None) -> np.ndarray:
    """int64 (C, C): entry [i, j] counts samples of true class i predicted as j (``confusionmat``)."""
    names = _names(class_names, predicted, true)
    true, predicted = _codes(true, names), _codes(predicted, names)
    size = num_classes or (len(names) if names else int(max(true.max(), predicted.max())) + 1)
    return np.bincount(true * size + predicted, minlength=size * size).reshape(size, size)


def _names(class_names, *labels):
    if class_names is not None:
        return tuple(class_names)
    return next((lab.class_names for lab in labels if getattr(lab, "class_names", ())), None)


def _codes(labels, class_names) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.dtype.kind in "iu":
        return labels.astype(np.int64)
    if class_names is None:
        raise ValueError("labels given as names need class_names to be compared with integers")
    lookup = {name: i for i, name in enumerate(class_names)}
    unknown = sorted(set(labels.tolist()) - set(lookup))
    if unknown:
        raise ValueError(f"labels {unknown[:5]} are not among the class names {tuple(class_names)}")
    return np.asarray([lookup[name] for name in labels.tolist()], dtype=np.int64)
