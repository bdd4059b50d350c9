"""``predict`` (MATLAB's ``minibatchpredict``) split over every device, and its scoring:
labels, accuracy and confusion counts.

Every sample is scored exactly once on any number of devices (``forward.ForwardPass``
pads and cuts), and with several processes every process receives every score.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxflowers.forward import ForwardPass
from jaxflowers.parallel import DataParallel, select_devices


def predict(net, data, *, mini_batch_size: int = 128, execution_environment: str = "auto",
            num_devices: int | None = None, strategy: str = "shard_map") -> np.ndarray:
    """Class scores for every image, split over the devices (``minibatchpredict``).

    Args:
      net: a ``TrainedNet`` from ``train``.
      data: an image set (anything with ``images``) or a uint8 array (n, H, W, C).
      mini_batch_size: images per device per forward pass.
      execution_environment: which devices, as in ``TrainingOptions``.
      num_devices, strategy: as in ``ExecutionOptions``.

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
    if len(images) == 0:  # nothing to split over the devices; no program to compile
        return np.zeros((0, len(net.class_names)), np.float32)
    parallel = DataParallel(select_devices(execution_environment, num_devices), strategy)
    # Right after ``train`` (same devices, batch and image count) this is its validation
    # pass, already traced and compiled.
    forward = ForwardPass(parallel, net.model, net.dtype, mini_batch_size)
    variables = parallel.put(net.variables)
    stats = parallel.put(tuple(np.asarray(s, np.float32) for s in net.normalization))
    logits = forward.logits(variables, forward.place(images), stats)
    # On the host: the logits are here already, and an eager softmax on the devices would
    # compile several small programs in every run.
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
