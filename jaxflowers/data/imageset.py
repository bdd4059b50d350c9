"""The in-memory image set every trainer, predictor and data source speaks.

Anything with ``images`` (uint8 (N, H, W, C)), ``labels`` (int32 (N,)) and ``class_names`` can
be passed to :func:`jaxflowers.train` and :func:`jaxflowers.predict`.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxflowers.data.mapped import take_rows

__all__ = ["ImageSet", "Labelled", "count_each_label", "split_each_label"]


class Labelled:
    """``countEachLabel`` and ``splitEachLabel`` for sets with ``labels`` and ``subset``."""

    def counts(self) -> dict[str, int]:
        """Images per class, zeros included; MATLAB's ``countEachLabel``."""
        return count_each_label(self.labels, self.class_names)

    def split_each_label(self, *fractions: float | int, seed: int = 0) -> tuple:
        """Stratified random split; MATLAB's ``splitEachLabel(imds, p, "randomized")``.

        Args:
          *fractions: one or two fractions in (0, 1) or counts per class; the rest is the last
            part, so ``split_each_label(0.9)`` gives two sets, ``(0.8, 0.1)`` three.
          seed: the split is a deterministic function of ``seed``.

        Returns:
          ``len(fractions) + 1`` sets of this kind; ``ValueError`` if a part would miss a class.
        """
        parts = split_each_label(self.labels, fractions, seed=seed, class_names=self.class_names)
        return tuple(self.subset(p) for p in parts)


@dataclasses.dataclass(frozen=True, eq=False)
class ImageSet(Labelled):
    """Images with integer labels and class names, all in host memory.

    Attributes:
      images: uint8 array (N, H, W, C), or a read-only memory map of one.
      labels: int32 array (N,), values in ``range(len(class_names))``.
      class_names: tuple of str, the name of each label.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]

    def __post_init__(self):
        images, labels = self.images, np.asarray(self.labels)
        if images.dtype != np.uint8 or images.ndim != 4:
            raise ValueError(
                f"images must be uint8 with shape (N, H, W, C); got {images.dtype} {images.shape}")
        if labels.shape != (images.shape[0],):
            raise ValueError(
                f"labels must have shape ({images.shape[0]},) to match images; got {labels.shape}")
        if len(labels) and (labels.min() < 0 or labels.max() >= len(self.class_names)):
            raise ValueError(
                f"labels must lie in [0, {len(self.class_names)}) for {len(self.class_names)} "
                f"class names; got values in [{labels.min()}, {labels.max()}]")
        object.__setattr__(self, "labels", labels.astype(np.int32))
        object.__setattr__(self, "class_names", tuple(str(c) for c in self.class_names))

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __repr__(self) -> str:
        return (f"ImageSet({len(self)} images of {self.image_shape}, "
                f"{len(self.class_names)} classes)")

    def to_dict(self) -> dict:
        """``{"images", "labels", "class_names"}`` (``from_dict`` inverts it)."""
        return {"images": self.images, "labels": self.labels,
                "class_names": list(self.class_names)}

    @classmethod
    def from_dict(cls, fields: dict) -> "ImageSet":
        return cls(fields["images"], fields["labels"], tuple(fields["class_names"]))

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(H, W, C) of every image."""
        return tuple(self.images.shape[1:])

    def subset(self, indices: Sequence[int] | np.ndarray) -> "ImageSet":
        """A new set holding the images at ``indices`` (in that order)."""
        indices = np.asarray(indices, dtype=np.int64)
        return ImageSet(take_rows(self.images, indices), self.labels[indices], self.class_names)


def count_each_label(labels: np.ndarray, class_names: Sequence[str]) -> dict[str, int]:
    """Dict from class name to how many of ``labels`` carry it (zeros included)."""
    counts = np.bincount(np.asarray(labels), minlength=len(class_names))
    return {name: int(c) for name, c in zip(class_names, counts)}


def split_each_label(labels: np.ndarray, fractions: Sequence[float | int], *, seed: int,
                     class_names: Sequence[str]) -> list[np.ndarray]:
    """Index arrays of a stratified random split of ``labels`` (``Labelled.split_each_label``)."""
    if not fractions:
        raise ValueError("split_each_label needs at least one fraction or count")
    for p in fractions:
        if isinstance(p, (bool, np.bool_)) or not (
                (isinstance(p, (int, np.integer)) and p >= 1) or (0 < float(p) < 1)):
            raise ValueError(f"split_each_label: {p!r} is neither a fraction in (0, 1) "
                             "nor a positive integer count per label")
    if sum(float(p) for p in fractions if not isinstance(p, (int, np.integer))) >= 1:
        raise ValueError(f"split_each_label: fractions {tuple(fractions)} add up to 1 or more, "
                         "leaving nothing for the last part")
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    parts: list[list[np.ndarray]] = [[] for _ in range(len(fractions) + 1)]
    for label, name in enumerate(class_names):
        members = rng.permutation(np.flatnonzero(labels == label))
        sizes = [int(p) if isinstance(p, (int, np.integer)) else int(round(float(p) * len(members)))
                 for p in fractions]
        bounds = np.cumsum(sizes)
        if len(members) and (min(sizes) < 1 or bounds[-1] >= len(members)):
            raise ValueError(
                f"split_each_label{tuple(fractions)} leaves class {name!r} ({len(members)} images) "
                f"empty in one part (sizes {sizes} + {len(members) - bounds[-1]} remaining)")
        for i, chunk in enumerate(np.split(members, bounds)):
            parts[i].append(chunk)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]
