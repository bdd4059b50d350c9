"""The MATLAB examples' recipes: which data, model and options each job uses by default.

The CLI and the notebooks call these, so a recipe is written once.
"""
from __future__ import annotations

import os

from jaxflowers import models
from jaxflowers.data import Augmentation, ImageFolder, digits
from jaxflowers.options import TrainingOptions, scale_for_devices

IMAGE_SIZE = {"resnet50": (224, 224), "cifar_net": (32, 32)}


def load_data(name: str, *, model: str = "cifar_net", cache_dir: str | None = None):
    """An image set by name: "digits" (embedded, offline), "flowers" (downloaded to
    ``$JAXFLOWERS_DATA`` or ~/.cache/jaxflowers/data on first use), "cifar10" (TFDS), or a
    local folder / s3:// gs:// https:// URL of class folders."""
    size = IMAGE_SIZE[model]
    if name == "digits":
        return digits(size)
    if name == "flowers":
        from jaxflowers.data import download_flowers
        root = os.environ.get("JAXFLOWERS_DATA", os.path.expanduser("~/.cache/jaxflowers/data"))
        return ImageFolder(download_flowers(root), image_size=size, cache_dir=cache_dir)
    if name == "cifar10":
        from jaxflowers.data import tfds_source
        return tfds_source("cifar10", split="train", image_size=size)
    return ImageFolder(name, image_size=size, cache_dir=cache_dir)


def build_model(name: str, num_classes: int, *, depth: int = 2):
    """``resnet50`` or ``cifar_net`` (of ``depth``) with ``num_classes`` outputs."""
    if name == "resnet50":
        return models.resnet50(num_classes)
    if name == "cifar_net":
        return models.cifar_net(depth, num_classes)
    raise ValueError(f"model={name!r} is not one of resnet50, cifar_net")


def flowers_options(device_count: int, num_train: int, *, validation_data=None,
                    per_device_batch: int = 128, max_epochs: int = 80,
                    **overrides) -> TrainingOptions:
    """The multi-GPU example: Adam, 128 images per GPU, learning rate 1e-3 scaled with the
    batch, x0.1 every 50 of 80 epochs, reflection and +-30 px translation, validation once
    per epoch. ``device_count`` GPUs scale the batch and rate; ``overrides`` are further
    ``TrainingOptions`` fields."""
    base = TrainingOptions(
        solver="adam", initial_learn_rate=1e-3, mini_batch_size=per_device_batch,
        max_epochs=max_epochs, shuffle="every-epoch", learn_rate_schedule="piecewise",
        learn_rate_drop_factor=0.1, learn_rate_drop_period=50, validation_data=validation_data,
        augmentation=Augmentation(reflect_x=True, translate_x=(-30, 30), translate_y=(-30, 30)),
        l2_regularization=1e-4, **overrides)
    scaled = scale_for_devices(base, device_count)
    return scaled.replace(validation_frequency=max(1, num_train // scaled.mini_batch_size))


def sweep_options(num_train: int, *, max_epochs: int = 30, mini_batch_size: int = 128,
                  **overrides) -> TrainingOptions:
    """The parfeval example: SGDM, LR 0.1*128/256, L2 1e-10, mini-batch 128, +-4 px
    translation and reflection, validation once per epoch."""
    return TrainingOptions(
        solver="sgdm", initial_learn_rate=0.1 * 128 / 256, momentum=0.9, l2_regularization=1e-10,
        mini_batch_size=mini_batch_size, max_epochs=max_epochs, shuffle="every-epoch",
        augmentation=Augmentation(reflect_x=True, translate_x=(-4, 4), translate_y=(-4, 4)),
        validation_frequency=max(1, num_train // mini_batch_size), **overrides)


def digits_options(*, validation_data=None, max_epochs: int = 15, mini_batch_size: int = 128,
                   **overrides) -> TrainingOptions:
    """The offline main job on the embedded digits: Adam 1e-3, +-2 px translation, 15
    epochs (test accuracy of cifar_net(2) over split/init seeds 0-3 on one CPU device:
    98.9/99.4/99.4/98.3%; 10 epochs gave 95.0% on seed 0)."""
    return TrainingOptions(
        solver="adam", initial_learn_rate=1e-3, mini_batch_size=mini_batch_size,
        max_epochs=max_epochs, shuffle="every-epoch", validation_data=validation_data,
        validation_frequency=20,
        augmentation=Augmentation(translate_x=(-2, 2), translate_y=(-2, 2)), **overrides)
