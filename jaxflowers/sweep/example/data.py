"""The data of MATLAB's parfeval example, passed to the jobs by reference as a "plan".

A plan is small JSON-able data (a data spec, split parameters and a seed); every worker
loads and splits the data itself, deterministically, and the caller rebuilds the same
test set after the jobs end. Folder data are decoded into their resize caches by the
caller before any job starts (:func:`prepare_data`), so the workers only open finished
caches. Nothing here imports JAX.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from jaxflowers import recipes
from jaxflowers.sweep.jobs import load_data

IMAGE_SIZE = recipes.IMAGE_SIZE["cifar_net"]  # as in the MATLAB example
HOLD_OUT = (0.8, 0.1)  # digits or a plain folder: train / validation / rest for test
CIFAR_VALIDATION = 0.1  # CIFAR-10: 5,000 of the 50,000 training images validate


class DataUnavailableError(RuntimeError):
    """The sweep's data set cannot be loaded here (e.g. CIFAR-10 not prepared for TFDS)."""


def data_plan(data: str, *, seed: int = 0) -> dict:
    """How the example gets its three sets from ``data``, as JSON-able data for the jobs.

    Args:
      data: "cifar10" (TFDS, prepared beforehand: its test split, 5,000 training images
        held out for validation), "digits" (embedded, offline) or a local folder. A folder
        holding ``train/`` and ``test/`` class folders is split like CIFAR-10; any other
        folder of class folders, like "digits", by ``split_each_label(0.8, 0.1)``
        (train / validation / test). Folder images are resized to 32 x 32.
      seed: the seed of the stratified random splits.

    Returns:
      ``{"train": spec, "validation": fraction, "test": spec, "seed": seed}`` or
      ``{"source": spec, "fractions": [0.8, 0.1], "seed": seed}``, where each spec is one
      that ``jaxflowers.sweep.jobs.load_data`` understands.

    Raises:
      DataUnavailableError: CIFAR-10 is not prepared, or ``data`` names nothing known.
    """
    if data == "cifar10":
        _require_tfds("cifar10")
        return {"train": "cifar10", "validation": CIFAR_VALIDATION, "test": "cifar10:test",
                "seed": seed}
    if data == "digits":
        return {"source": "digits", "fractions": list(HOLD_OUT), "seed": seed}
    if not os.path.isdir(data):
        raise DataUnavailableError(f"data {data!r} is neither 'cifar10', 'digits' nor an "
                                   "existing folder of class folders")
    root = os.path.abspath(data)
    parts = {p: {"folder": os.path.join(root, p), "image_size": list(IMAGE_SIZE)}
             for p in ("train", "test")}
    if all(os.path.isdir(p["folder"]) for p in parts.values()):
        return {**parts, "validation": CIFAR_VALIDATION, "seed": seed}
    return {"source": {"folder": root, "image_size": list(IMAGE_SIZE)},
            "fractions": list(HOLD_OUT), "seed": seed}


def describe(plan: Mapping) -> str:
    """One line saying which data a :func:`data_plan` uses and how it is split."""
    seed = plan.get("seed", 0)
    if "source" in plan:
        source = plan["source"]
        what = ("the handwritten digits embedded in scikit-learn (1,797 images, offline)"
                if source == "digits" else f"the class folders of {source['folder']}")
        train, validation = plan["fractions"]
        return (f"{what}, split {train:.0%} training, {validation:.0%} validation and the "
                f"rest test per class (seed {seed})")
    train = plan["train"]
    what = "CIFAR-10 (TFDS)" if train == "cifar10" else \
        f"{train['folder']} for training and {plan['test']['folder']} for testing"
    return (f"{what}, {plan['validation']:.0%} of each training class held out for "
            f"validation (seed {seed})")


def _require_tfds(name: str) -> None:
    """Raise ``DataUnavailableError`` unless TFDS has ``name`` prepared (imports no JAX).

    Preparing needs TensorFlow and a network; several workers doing it at once would race,
    so the sweep asks for a prepared set instead.
    """
    hint = (" Run the sweep offline with --data digits (embedded) or --data FOLDER (class "
            "folders, or train/ and test/ holding class folders).")
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataUnavailableError(f"--data {name} needs tensorflow-datasets "
                                   f'(pip install "jaxflowers[tfds]").{hint}') from None
    try:
        builder = tfds.builder(name)
        prepared = builder.is_prepared()
    except Exception as error:  # noqa: BLE001 (a broken data_dir is "not available" too)
        raise DataUnavailableError(f"TFDS cannot open {name!r}: {error}.{hint}") from error
    if not prepared:
        raise DataUnavailableError(
            f"TFDS data set {name!r} is not prepared in {builder.data_dir}. Prepare it once "
            f"where TensorFlow and a network are available (tfds build {name} "
            "--file_format=array_record) and set TFDS_DATA_DIR to that folder." + hint)


def load_sets(plan: Mapping) -> tuple[Any, Any, Any]:
    """(train, validation, test) image sets of a :func:`data_plan`; may import JAX."""
    seed = plan.get("seed", 0)
    if "source" in plan:
        whole, _ = load_data(plan["source"])
        return whole.split_each_label(*plan["fractions"], seed=seed)
    train, validation = load_data({"train": plan["train"], "validation": plan["validation"],
                                   "seed": seed})
    test, _ = load_data(plan["test"])
    return train, validation, test


def prepare_data(plan: Mapping) -> list:
    """Build (or open) the resize cache of every folder in ``plan``, here; imports no JAX.

    ``run_sweep`` calls it before submitting any job. Otherwise the first worker would
    decode every image while the others wait on the cache's lock; here the caller
    decodes (in processes, for a large folder) and the workers only open the caches.

    Args:
      plan: a :func:`data_plan`.

    Returns:
      The ``ImageFolder`` of each folder spec in ``plan``, caches ready (none for
      "digits" or CIFAR-10).

    Raises:
      DataUnavailableError: a folder cannot be read or holds an undecodable image.
    """
    folders = []
    for part in ("source", "train", "test"):
        spec = plan.get(part)
        if isinstance(spec, Mapping) and "folder" in spec:
            try:
                folder, _ = load_data(spec)  # the ImageFolder the workers will construct
                folder.cache_path  # builds the cache, or opens a valid one
            except (OSError, ValueError) as error:
                raise DataUnavailableError(f"cannot prepare {spec['folder']}: {error}"
                                           ) from error
            folders.append(folder)
    return folders
