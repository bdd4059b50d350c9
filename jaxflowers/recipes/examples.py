"""The recipes: the two MATLAB examples' options (and variants), by name; imports no JAX.

``"flowers"`` is "Train Network Using Automatic Multi-GPU Support", ``"sweep"`` is "Use parfeval
to Train Multiple Deep Learning Networks", both verbatim; variants carry their own names
(``"flowers-tuned"``, ``"flowers-pretrained"``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from jaxflowers.options.training import TrainingOptions

__all__ = ["EXAMPLE_AUGMENTATION", "RECIPES", "Recipe", "augmentation", "digits_options",
           "flowers_options", "flowers_pretrained_options", "flowers_tuned_options", "recipe",
           "recipe_for", "sweep_options"]

# Each MATLAB example's imageDataAugmenter, as ``Augmentation`` fields.
EXAMPLE_AUGMENTATION = {
    "flowers": {"reflect_x": True, "translate_x": (-30, 30), "translate_y": (-30, 30)},
    "sweep": {"reflect_x": True, "translate_x": (-4, 4), "translate_y": (-4, 4)},
}


def augmentation(example: str):
    """The ``Augmentation`` of a MATLAB example ("flowers" or "sweep")."""
    from jaxflowers.data.augment import Augmentation
    return Augmentation(**EXAMPLE_AUGMENTATION[example])


# ---------------------------------------------------------------- option sets

def flowers_options(device_count: int, num_train: int, *, per_device_batch: int = 128,
                    max_epochs: int = 80, **overrides) -> TrainingOptions:
    """The multi-GPU example's options, verbatim (Adam at ``1e-2*miniBatchSize/64``).

    Args:
      device_count: GPUs (numGPUs); the batch and rate scale with it.
      num_train: training images, for the validation frequency.
      per_device_batch, max_epochs: 128 and 80 in the example.
      **overrides: further ``TrainingOptions`` fields.
    """
    from jaxflowers.options.training import TrainingOptions

    batch = per_device_batch * device_count
    fields = dict(
        solver="adam", initial_learn_rate=1e-2 * batch / 64, mini_batch_size=batch,
        max_epochs=max_epochs, shuffle="every-epoch", learn_rate_schedule="piecewise",
        learn_rate_drop_factor=0.1, learn_rate_drop_period=50,
        augmentation=augmentation("flowers"),
        validation_frequency=max(1, math.floor(4 * num_train / batch)))
    return TrainingOptions(**{**fields, **overrides})


def flowers_tuned_options(device_count: int, num_train: int, *, per_device_batch: int = 128,
                          max_epochs: int = 80, **overrides) -> TrainingOptions:
    """The multi-GPU example with Adam at 1e-3 x GPUs, validated once per epoch."""
    base = flowers_options(1, num_train, per_device_batch=per_device_batch,
                           max_epochs=max_epochs, **overrides).replace(initial_learn_rate=1e-3)
    scaled = base.scaled(device_count)
    return scaled.replace(validation_frequency=max(1, num_train // scaled.mini_batch_size))


def flowers_pretrained_options(device_count: int, num_train: int, *,
                               per_device_batch: int = 128, max_epochs: int = 10,
                               **overrides) -> TrainingOptions:
    """Fine-tuning ImageNet weights on Flowers (MATLAB's "Retrain Neural Network to Classify
    New Images": a fresh head at 10x the rate): the example's data, split and augmentation,
    Adam at 1e-4 x batch/128 with ``learn_rate_factors={"head": 10}``, 10 epochs, validated
    once per epoch, no rate drops. The network comes from ``--weights``
    (``models.pretrained``)."""
    from jaxflowers.options.training import TrainingOptions

    batch = per_device_batch * device_count
    fields = dict(
        solver="adam", initial_learn_rate=1e-4 * batch / 128, mini_batch_size=batch,
        max_epochs=max_epochs, shuffle="every-epoch", augmentation=augmentation("flowers"),
        learn_rate_factors={"head": 10.0},
        validation_frequency=max(1, num_train // batch))
    return TrainingOptions(**{**fields, **overrides})


def sweep_options(num_train: int, *, max_epochs: int = 30, mini_batch_size: int = 128,
                  **overrides) -> TrainingOptions:
    """The parfeval example's options, verbatim (SGDM at ``0.1*miniBatchSize/256``)."""
    from jaxflowers.options.training import TrainingOptions

    fields = dict(
        solver="sgdm", initial_learn_rate=0.1 * mini_batch_size / 256, momentum=0.9,
        l2_regularization=1e-10, mini_batch_size=mini_batch_size, max_epochs=max_epochs,
        shuffle="every-epoch", augmentation=augmentation("sweep"),
        validation_frequency=max(1, num_train // mini_batch_size),
        output_network="last-iteration")  # trainNetwork's when the example was published
    return TrainingOptions(**{**fields, **overrides})


def digits_options(*, validation_data=None, max_epochs: int = 15, mini_batch_size: int = 128,
                   **overrides) -> TrainingOptions:
    """The offline main job on the embedded digits: Adam 1e-3, +-2 px translation."""
    from jaxflowers.data.augment import Augmentation
    from jaxflowers.options.training import TrainingOptions

    fields = dict(
        solver="adam", initial_learn_rate=1e-3, mini_batch_size=mini_batch_size,
        max_epochs=max_epochs, shuffle="every-epoch", validation_data=validation_data,
        # moving statistics, last network: here the population pass costs more than it gains
        validation_frequency=20, batch_normalization_statistics="moving",
        output_network="last-iteration",
        augmentation=Augmentation(translate_x=(-2, 2), translate_y=(-2, 2)))
    return TrainingOptions(**{**fields, **overrides})


# ---------------------------------------------------------------- the registry

@dataclasses.dataclass(frozen=True)
class Recipe:
    """A named way to train: default data set and model, the options, the split.

    Attributes:
      name, summary: the key in :data:`RECIPES` (``--recipe``), and one line for ``--help``.
      data, model: the default data set and network names.
      option_set: ``option_set(device_count, num_train, **fields) -> TrainingOptions``.
      per_device_batch: the batch is per device and scales with the devices.
      train_fraction: each label's share of the training set; the rest validates.
      needs_weights: the recipe fine-tunes a pretrained network (``--weights``).
      scaling: how the batch and the learning rate follow the devices, in words.
    """

    name: str
    summary: str
    data: str
    model: str
    option_set: Callable[..., TrainingOptions]
    per_device_batch: bool = False
    train_fraction: float = 0.9
    needs_weights: bool = False
    scaling: str = "mini-batch and learning rate the same on any number of devices"

    def options(self, device_count: int, num_train: int, *, batch_size: int | None = None,
                **overrides) -> TrainingOptions:
        """The recipe's ``TrainingOptions``; ``batch_size`` is the global ``MiniBatchSize``."""
        if batch_size is not None and self.per_device_batch:
            if batch_size % device_count:
                raise ValueError(f"batch size {batch_size} is not a multiple of the "
                                 f"{device_count} devices")
            overrides["per_device_batch"] = batch_size // device_count
        elif batch_size is not None:
            overrides["mini_batch_size"] = batch_size
        return self.option_set(device_count, num_train, **overrides)


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("flowers", "MATLAB's multi-GPU example, verbatim: ResNet-50 on Flowers, Adam at "
           "1e-2 x batch/64, 128 images per GPU, 80 epochs", "flowers", "resnet50",
           flowers_options, per_device_batch=True,
           scaling="128 images per device, learning rate 1e-2 x mini-batch / 64: the "
                   "example's rule"),
    Recipe("flowers-tuned", "the multi-GPU example with Adam at 1e-3 x GPUs, validated "
           "every epoch", "flowers", "resnet50", flowers_tuned_options, per_device_batch=True,
           scaling="128 images per device, learning rate 1e-3 x devices (Goyal et al. 2017)"),
    Recipe("sweep", "MATLAB's parfeval example, verbatim: cifar_net on CIFAR-10, SGDM at "
           "0.05, 30 epochs", "cifar10", "cifar_net",
           lambda device_count, num_train, **kw: sweep_options(num_train, **kw)),
    Recipe("digits", "the offline main job: cifar_net on the embedded digits, Adam at 1e-3, "
           "15 epochs", "digits", "cifar_net",
           lambda device_count, num_train, **kw: digits_options(**kw)),
    Recipe("flowers-pretrained", "fine-tuning ImageNet weights (--weights) on Flowers: Adam "
           "at 1e-4 x batch/128, the head at 10x, 10 epochs", "flowers", "resnet50",
           flowers_pretrained_options, per_device_batch=True, needs_weights=True,
           scaling="128 images per device, learning rate 1e-4 x mini-batch / 128, the new "
                   "head at 10x"),
)}


def recipe(name: str) -> Recipe:
    """The :class:`Recipe` called ``name`` (a key of :data:`RECIPES`)."""
    if name not in RECIPES:
        raise ValueError(f"recipe={name!r} is not one of {', '.join(RECIPES)}")
    return RECIPES[name]


def recipe_for(data: str, model: str | None = None, *, weights: bool = False) -> Recipe:
    """The default recipe: fine-tuning with ``weights``, the multi-GPU example for Flowers or
    a ResNet, else digits."""
    if weights:
        return RECIPES["flowers-pretrained"]
    if data == "flowers" or (model or "").startswith("resnet"):
        return RECIPES["flowers"]
    return RECIPES["digits"]
