"""TensorFlow Datasets sources (cifar10, tf_flowers, ...) read through ``tfds.data_source``.

Reading a prepared ArrayRecord set needs no TensorFlow; preparing one does. Tests mock TFDS
with ``MockPolicy.USE_FILES`` and real metadata (the code-only policy looks unprepared).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import operator
import os
from typing import Any, Sequence

import numpy as np
from PIL import Image

from jaxflowers.data.imageset import ImageSet
from jaxflowers.data.imread import resize

__all__ = ["TfdsImages", "tfds_source"]


@dataclasses.dataclass(frozen=True, eq=False)
class TfdsImages:
    """Random-access view of a TFDS split for grain: ``s[i]`` is ``{"image", "label"}``.

    Attributes:
      source: the ``tfds.data_source`` split (any sequence of dicts with "image" and "label").
      image_size: (height, width) to resize every uint8 (H, W, C) image to, or None.
    """

    source: Sequence[dict[str, Any]]
    class_names: tuple[str, ...]
    image_size: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self._convert(self.source[operator.index(index)])

    def _convert(self, example: dict[str, Any]) -> dict[str, Any]:
        image = np.asarray(example["image"], dtype=np.uint8)
        if self.image_size is not None:
            image = _resize(image, self.image_size)
        return {"image": image, "label": int(example["label"])}


def tfds_source(name: str, split: str = "train", *, data_dir: str | os.PathLike | None = None,
                image_size: tuple[int, int] | None = None,
                as_stream: bool = False) -> ImageSet | TfdsImages:
    """A TFDS image-classification split as an ``ImageSet`` (in memory) or a stream.

    Args:
      name: TFDS name with "image" and "label" (``ClassLabel``) features, e.g. "cifar10".
      split: TFDS split string: "train", "test", "train[:90%]", ...
      data_dir: TFDS data folder; None means ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``.
      image_size: (height, width), resized as ImageFolder's cache does; needed when sizes vary.
      as_stream: return a lazy ``TfdsImages`` (for grain) instead of loading everything.

    Returns:
      An ``ImageSet`` (uint8 images (N, H, W, C), int32 labels (N,)), or a ``TfdsImages``.

    Raises:
      ImportError, RuntimeError: no tensorflow-datasets, or an unprepared set and no TensorFlow.
    """
    size = None if image_size is None else _check_size(image_size)
    tfds = _import_tfds()
    builder = tfds.builder(name, data_dir=data_dir)
    class_names = _check_features(builder.info, name, image_size)
    prepared = builder.is_prepared()
    if not prepared:
        _check_can_prepare(name, builder, data_dir)
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=not prepared)
    stream = TfdsImages(source, class_names, size)
    return stream if as_stream else _load_all(stream)


def _load_all(stream: TfdsImages) -> ImageSet:
    n = len(stream)
    if n == 0:
        raise ValueError("the TFDS split is empty")
    first = stream[0]["image"]
    images = np.empty((n,) + first.shape, np.uint8)
    labels = np.empty(n, np.int32)
    for i in range(n):  # one by one: decoding dominates, batched reads would not help
        example = stream[i]
        if example["image"].shape != first.shape:
            raise ValueError(f"example {i} has shape {example['image'].shape}, example 0 "
                             f"has {first.shape}; pass image_size=(height, width)")
        images[i], labels[i] = example["image"], example["label"]
    return ImageSet(images, labels, stream.class_names)


def _resize(image: np.ndarray, image_size: tuple[int, int]) -> np.ndarray:
    """uint8 (H, W, C) (C in {1, 3, 4}) or (H, W) at ``image_size`` (``imread.resize``)."""
    if image.shape[:2] == tuple(image_size):
        return image
    grey = image.ndim == 3 and image.shape[-1] == 1
    out = np.asarray(resize(Image.fromarray(image[..., 0] if grey else image), image_size))
    return out[..., None] if grey else out


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:
        raise ImportError('TFDS data sets need tensorflow-datasets: '
                          'pip install "jaxflowers[tfds]"') from err
    return tfds


def _check_features(info, name: str, image_size) -> tuple[str, ...]:
    """The class names; raises unless ``name`` has usable "image" and "label" features."""
    import tensorflow_datasets as tfds

    features = info.features
    keys = set(features.keys())
    if not {"image", "label"} <= keys:
        raise ValueError(f"TFDS data set {name!r} has features {sorted(keys)}; "
                         "tfds_source needs an 'image' and a 'label' feature")
    image, label = features["image"], features["label"]
    if not (isinstance(image, tfds.features.Image) and
            isinstance(label, tfds.features.ClassLabel)):
        raise ValueError(f"TFDS data set {name!r}: 'image' is a {type(image).__name__} and "
                         f"'label' a {type(label).__name__}; need Image and ClassLabel")
    if image_size is None and None in tuple(image.shape[:2]):
        raise ValueError(f"TFDS data set {name!r} has images of varying size "
                         f"{tuple(image.shape)}; pass image_size=(height, width), "
                         "e.g. image_size=(224, 224)")
    return tuple(label.names)


def _check_can_prepare(name: str, builder, data_dir) -> None:
    if importlib.util.find_spec("tensorflow") is not None:
        return
    where = (f"data_dir={str(data_dir)!r}" if data_dir is not None else
             "the default data_dir ($TFDS_DATA_DIR or ~/tensorflow_datasets)")
    raise RuntimeError(
        f"TFDS data set {name!r} is not prepared in {where} (looked for {builder.data_dir}). "
        "Preparing it (download + conversion to ArrayRecord) needs TensorFlow, which is not "
        'installed: pip install "jaxflowers[tfds-prepare]" (or pip install tensorflow). Or '
        f"prepare it on a machine with TensorFlow (tfds build {name} "
        "--file_format=array_record) and pass data_dir= pointing at that folder.")


def _check_size(image_size) -> tuple[int, int]:
    size = tuple(int(s) for s in image_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be (height, width) with positive sizes; "
                         f"got {image_size!r}")
    return size
