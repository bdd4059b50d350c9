"""Data sets by name, and plans: where a run's training, validation and test sets come from.

A *spec* is ``"digits"``, ``"flowers"``, ``"cifar10"``, ``"tfds:NAME[:SPLIT]"``, a folder or URL
of class folders, ``{"folder": path, "image_size": [h, w]}``, or an image set. A *plan* (JSON, so
sweep workers rebuild the same split) is ``{"train", "test", "validation"}`` or ``{"source",
"fractions"}`` (split per class, the rest tests), with ``"seed"`` and ``"image_size"``, and
``"listings"`` where ``share_plan`` saved the folders' checked listings for the workers. No JAX.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Mapping

__all__ = ["DATASETS", "DataUnavailableError", "data_plan", "describe_plan", "is_plan", "load_data",
           "load_plan", "prepare_plan", "share_plan"]

DATASETS = ("digits", "flowers", "cifar10")  # names; anything else is a folder, URL or tfds:


class DataUnavailableError(RuntimeError):
    """The data cannot be loaded here (CIFAR-10 not prepared for TFDS, a missing folder)."""


def load_data(spec, *, image_size=None, cache_dir: str | os.PathLike | None = None,
              fingerprint: str = "stat", listing: str | None = None):
    """One image set (uint8 ``images`` (N, H, W, 3), ``labels``, ``class_names``) from a spec.

    Args:
      spec: the data set (see the module).
      image_size: (height, width); None: a folder's 224 x 224, the digits' 32 x 32, TFDS's own.
      cache_dir, fingerprint, listing: as ``ImageFolder``'s (a listing of a folder spec).
    """
    from jaxflowers.data import ImageFolder, digits

    size = None if image_size is None else tuple(int(v) for v in image_size)
    if hasattr(spec, "images") and hasattr(spec, "labels"):
        return spec
    if isinstance(spec, Mapping) and "folder" in spec:
        size = tuple(spec.get("image_size") or size or (224, 224))
        return ImageFolder(spec["folder"], image_size=size, cache_dir=cache_dir,
                           fingerprint=fingerprint, listing=listing)
    if not isinstance(spec, (str, os.PathLike)) or not str(spec):
        raise ValueError(f"data {spec!r}: use 'digits', 'flowers', 'cifar10', "
                         "'tfds:NAME[:SPLIT]', a folder or URL of class folders, "
                         "{'folder': path, 'image_size': [h, w]} or an image set")
    spec = os.fspath(spec)
    if spec == "digits":
        return digits(size or (32, 32))
    if spec == "flowers":
        from jaxflowers.data import download_flowers
        root = os.environ.get("JAXFLOWERS_DATA", os.path.expanduser("~/.cache/jaxflowers/data"))
        return ImageFolder(download_flowers(root), image_size=size or (224, 224),
                           cache_dir=cache_dir, fingerprint=fingerprint)
    name, _, split = spec.removeprefix("tfds:").partition(":")
    if spec.startswith("tfds:") or name == "cifar10":
        from jaxflowers.data import tfds_source
        return tfds_source(name, split or "train", image_size=size)
    if "://" in spec or os.sep in spec or os.path.exists(spec):  # a missing folder: its error
        return ImageFolder(spec, image_size=size or (224, 224), cache_dir=cache_dir,
                           fingerprint=fingerprint, listing=listing)
    raise DataUnavailableError(f"data {spec!r} is neither a known set ({', '.join(DATASETS)}, "
                               "tfds:NAME) nor an existing folder")


def is_plan(data) -> bool:
    return isinstance(data, Mapping) and ("train" in data or "source" in data)


def data_plan(data, *, image_size, train_fraction: float = 0.9,
              validation_fraction: float | None = None, seed: int = 0,
              fingerprint: str = "stat") -> dict:
    """How a run gets its sets from ``data`` (a spec, or a plan to complete), as a plan.

    Args:
      image_size: (height, width) of every image.
      train_fraction: each class's share that trains when one set is split.
      validation_fraction: each class's share held out for validation; None: none.
      seed, fingerprint: the splits' seed; ``ImageFolder``'s fingerprint.

    Returns:
      ``{"train", "test", "validation"}`` for CIFAR-10 and folders holding ``train/`` and
      ``test/``, else ``{"source", "fractions"}``.
    """
    common = {"seed": int(seed), "image_size": [int(v) for v in image_size]}
    if fingerprint != "stat":
        common["fingerprint"] = fingerprint
    if is_plan(data):
        return {**common, **data}
    if data == "cifar10" or str(data).startswith("tfds:"):
        name = str(data).removeprefix("tfds:").split(":")[0]
        return {**common, "train": f"tfds:{name}:train", "test": f"tfds:{name}:test",
                "validation": validation_fraction}
    if isinstance(data, (str, os.PathLike)) and os.path.isdir(data):
        root = os.path.abspath(data)
        parts = {p: os.path.join(root, p) for p in ("train", "test")}
        if all(os.path.isdir(p) for p in parts.values()):
            return {**common, **parts, "validation": validation_fraction}
        data = root
    fractions = [train_fraction] if validation_fraction is None else [
        train_fraction, validation_fraction]
    return {**common, "source": data, "fractions": fractions}


def load_plan(plan) -> tuple[Any, Any, Any]:
    """``(train, validation, test)`` image sets of a plan or spec (None where it has none)."""
    if not is_plan(plan):
        return load_data(plan), None, None
    size, seed, listings = plan.get("image_size"), plan.get("seed", 0), plan.get("listings", {})

    def load(part):
        return load_data(plan[part], image_size=size, listing=listings.get(part),
                         fingerprint=plan.get("fingerprint", "stat"))

    if "source" in plan:
        parts = load("source").split_each_label(*plan["fractions"], seed=seed)
        return (parts[0], parts[1], parts[2]) if len(parts) == 3 else (parts[0], None, parts[1])
    train = load("train")
    validation = plan.get("validation")
    if isinstance(validation, float):
        train, validation = train.split_each_label(1.0 - validation, seed=seed)
    elif validation is not None:
        validation = load("validation")
    test = load("test") if plan.get("test") is not None else None
    _check_same_classes(plan, train, test)
    return train, validation, test


def _check_same_classes(plan, train, test) -> None:
    if test is not None and tuple(train.class_names) != tuple(test.class_names):
        raise ValueError(f"{plan['test']} has the classes {tuple(test.class_names)} but "
                         f"{plan['train']} has {tuple(train.class_names)}; both need the same "
                         "class folders")


def describe_plan(plan) -> str:
    """One line saying where a plan's sets come from and how they are split."""
    seed = plan.get("seed", 0)
    if "source" in plan:
        source = plan["source"]
        what = ("the handwritten digits embedded in scikit-learn (1,797 images, offline)"
                if source == "digits" else f"{_name(source)}")
        shares = [f"{f:.0%} training" for f in plan["fractions"][:1]] + [
            f"{f:.0%} validation" for f in plan["fractions"][1:]]
        return f"{what}, split {', '.join(shares)} and the rest test per class (seed {seed})"
    train = _name(plan["train"])
    what = (f"TFDS {train.split(':')[1]} (its train and test splits)" if train.startswith("tfds:")
            else f"{train} for training and {_name(plan['test'])} for testing")
    validation = plan.get("validation")
    if isinstance(validation, float):
        what += f", {validation:.0%} of each training class held out for validation (seed {seed})"
    return what


def _name(spec) -> str:
    return spec["folder"] if isinstance(spec, Mapping) else str(spec)


def prepare_plan(plan) -> list:
    """Check TFDS sets are prepared and build every folder's resize cache, without JAX.

    A sweep calls it first, so its workers open finished caches instead of all decoding at once.
    Returns each folder's ``ImageFolder``; raises ``DataUnavailableError`` if a set is not ready.
    """
    return list(_prepare_parts(plan).values())


def share_plan(plan, directory: str | os.PathLike) -> tuple[dict, list]:
    """``prepare_plan``, then each folder's checked listing saved in ``directory``.

    The workers loading the returned plan soon after open those listings instead of listing
    the folders and checking their caches again (a second for 50,000 files). A worker
    that cannot read a listing, or finds the cache changed, lists its folder itself.

    Returns:
      (the plan with ``"listings"``, each folder's ``ImageFolder``).
    """
    folders, listings = _prepare_parts(plan), {}
    for part, folder in folders.items():
        path = os.path.join(os.fspath(directory), f"listing-{part}.json")
        try:
            if folder.save_listing(path):
                listings[part] = path
        except OSError as error:  # the workers list the folder themselves
            warnings.warn(f"cannot save the listing of {_name(plan[part])} to {path}: {error}",
                          stacklevel=2)
    return ({**plan, "listings": listings} if listings else dict(plan)), list(folders.values())


def _prepare_parts(plan) -> dict:
    """``{part: ImageFolder}`` of the plan's folders, their caches built; TFDS checked."""
    folders = {}
    for part in ("source", "train", "validation", "test"):
        spec = plan.get(part)
        if spec is None or isinstance(spec, float) or spec == "digits":
            continue
        if isinstance(spec, str) and (spec == "cifar10" or spec.startswith("tfds:")):
            _require_tfds(spec.removeprefix("tfds:").split(":")[0])
            continue
        try:
            folder = load_data(spec, image_size=plan.get("image_size"),
                               fingerprint=plan.get("fingerprint", "stat"))
            folder.cache_path  # builds the cache, or opens a valid one
        except (OSError, ValueError) as error:
            raise DataUnavailableError(f"cannot prepare {_name(spec)}: {error}") from error
        folders[part] = folder
    return folders


def _require_tfds(name: str) -> None:
    """Raise ``DataUnavailableError`` unless TFDS has ``name`` prepared (workers would race)."""
    hint = (" Run offline with --data digits (embedded) or --data FOLDER (class folders, or "
            "train/ and test/ holding class folders).")
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
