"""Labels from scores, and scoring them (MATLAB's ``scores2label``, ``confusionmat``); no JAX."""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["Labels", "accuracy", "codes", "confusion_matrix", "log_softmax", "scores_to_labels"]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of (n, C) logits, along the last axis, on the host."""
    logits = np.asarray(logits, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # a non-finite row stays non-finite
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
        return codes(np.asarray(self), self.class_names)


def scores_to_labels(scores: np.ndarray, class_names: Sequence[str]) -> Labels:
    """The highest-scoring class name of each row, as ``Labels`` (MATLAB's ``scores2label``).

    Args:
      scores: float (n, C). class_names: the C names.

    Raises:
      ValueError: the scores do not match the class names, or some rows are not finite.
    """
    scores = np.asarray(scores)
    if scores.ndim != 2 or scores.shape[1] != len(class_names):
        raise ValueError(f"scores of shape {scores.shape} do not match {len(class_names)} "
                         "class names")
    bad = np.flatnonzero(~np.isfinite(scores).all(axis=1))
    if bad.size:
        raise ValueError(f"scores of {bad.size} of {len(scores)} images are not finite (first: "
                         f"row {bad[0]}); the network's outputs overflow, so no class can be "
                         "picked for them")
    return Labels(np.argmax(scores, axis=1), class_names)


def accuracy(predicted, true, class_names: Sequence[str] | None = None) -> float:
    """Fraction of ``predicted`` equal to ``true`` (names or integer labels, mixed allowed)."""
    names = _names(class_names, predicted, true)
    predicted, true = codes(predicted, names), codes(true, names)
    if predicted.shape != true.shape or predicted.size == 0:
        raise ValueError(f"accuracy needs two non-empty label arrays of one shape; got "
                         f"{predicted.shape} and {true.shape}")
    return float(np.mean(predicted == true))


def confusion_matrix(true, predicted, class_names: Sequence[str] | None = None,
                     num_classes: int | None = None, *, caller: str = "confusion_matrix"
                     ) -> np.ndarray:
    """int64 (C, C): [i, j] counts true class i predicted as j (MATLAB's ``confusionmat``).

    Args:
      true, predicted: labels as class names or integer codes, one per sample.
      class_names: the classes (default: those of a ``Labels`` argument).
      num_classes: C when no names are known (default: the largest code + 1).
      caller: the function named in error messages.

    Raises:
      ValueError: a label outside the classes, or arrays of different lengths.
    """
    names = _names(class_names, predicted, true)
    size = num_classes or (len(names) if names else None)
    true = codes(true, names, f"{caller}: true labels", size)
    predicted = codes(predicted, names, f"{caller}: predicted labels", size)
    if true.shape != predicted.shape:
        raise ValueError(f"{caller}: {true.size} true labels but {predicted.size} predictions")
    size = size or int(max(true.max(initial=-1), predicted.max(initial=-1))) + 1
    return np.bincount(true * size + predicted, minlength=size * size).reshape(size, size)


def _names(class_names, *labels):
    if class_names is not None:
        return tuple(class_names)
    return next((lab.class_names for lab in labels if getattr(lab, "class_names", ())), None)


def codes(labels, class_names, what: str = "labels", num_classes: int | None = None
          ) -> np.ndarray:
    """int64 class indices of ``labels`` (names or integers); a ValueError names ``what``."""
    labels = np.asarray(labels).reshape(-1)
    if labels.dtype.kind in "iu":
        size = num_classes or (len(class_names) if class_names else None)
        bad = labels[(labels < 0) | (labels >= size)] if size else labels[labels < 0]
        if bad.size:
            raise ValueError(f"{what} contains {int(bad[0])}, which is not one of the "
                             f"{size or 'non-negative'} classes"
                             + (f" {list(class_names)!r}" if class_names else ""))
        return labels.astype(np.int64)
    if class_names is None:
        raise ValueError("labels given as names need class_names to be compared with integers")
    lookup = {str(name): i for i, name in enumerate(class_names)}
    unknown = sorted({str(v) for v in labels.tolist()} - set(lookup))
    if unknown:
        raise ValueError(f"{what} {unknown[:5]} are not among the class names "
                         f"{tuple(class_names)}")
    return np.asarray([lookup[str(name)] for name in labels.tolist()], dtype=np.int64)
