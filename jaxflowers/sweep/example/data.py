"""The parfeval example's data: one plan of 32 x 32 images (``recipes.data_plan``) that every
job and the caller load alike. Imports no JAX."""
from __future__ import annotations

import os

from jaxflowers import recipes

__all__ = ["HOLD_OUT", "IMAGE_SIZE", "VALIDATION", "example_plan"]

IMAGE_SIZE = recipes.IMAGE_SIZE["cifar_net"]  # as in the MATLAB example
HOLD_OUT = (0.8, 0.1)  # one set: train / validation shares, the rest tests
VALIDATION = 0.1  # train/ and test/: the training classes' share that validates


def example_plan(data: str, *, seed: int = 0, image_size=IMAGE_SIZE) -> dict:
    """The plan of the example's three sets from ``data`` ("digits", "cifar10", a folder) at
    ``image_size`` (default 32 x 32); DataUnavailableError when ``data`` names nothing known."""
    known = data in ("digits", "cifar10") or str(data).startswith("tfds:")
    if not known and not os.path.isdir(data):
        raise recipes.DataUnavailableError(f"data {data!r} is neither 'cifar10', 'digits' nor "
                                           "an existing folder of class folders")
    plan = recipes.data_plan(data, image_size=image_size, train_fraction=HOLD_OUT[0],
                             validation_fraction=HOLD_OUT[1], seed=seed)
    if "train" in plan:
        plan["validation"] = VALIDATION
    return plan
