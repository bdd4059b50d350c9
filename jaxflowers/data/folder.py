"""ImageFolder: MATLAB's ``imageDatastore(..., LabelSource="foldernames")``, resized once.

Layout ``root/<class>/<image>``; names starting with "." are ignored. Construction only lists
files; the first read of ``images`` decodes them into :mod:`jaxflowers.data.cache`, which subsets
share. With ``on_error="skip"``, ``files``, ``labels`` and ``len()`` need the cache built first.
"""
from __future__ import annotations

import os
import threading
from typing import Sequence

import numpy as np

from jaxflowers.data import cache as cache_lib
from jaxflowers.data import remote
from jaxflowers.data import scan as scan_lib
from jaxflowers.data.imageset import ImageSet, Labelled
from jaxflowers.data.mapped import take_rows
from jaxflowers.data.scan import FINGERPRINTS, IMAGE_EXTENSIONS

__all__ = ["FINGERPRINTS", "IMAGE_EXTENSIONS", "ImageFolder"]


class ImageFolder(Labelled):
    """Images in class folders, resized once and memory-mapped; MATLAB's ``imageDatastore``.

    Args:
      root: a local folder or an fsspec URL (``s3://``, ``gs://``, ``https://``).
      image_size: (height, width) every image is resized to, or one int.
      include_subfolders: find images at any depth below each class folder.
      on_error: ``"raise"`` (``OSError`` naming the file) or ``"skip"`` (listed in ``skipped``).
      cache_dir: default ``$JAXFLOWERS_CACHE_DIR`` or ``~/.cache/jaxflowers``.
      workers: listing and decoding threads (or processes); a local folder that lists fast
        is listed in one thread, where more would only contend for the GIL.
      storage_options: keyword arguments for the fsspec file system of a URL root.
      fingerprint: how the cache sees a changed file: ``"stat"`` (size, times, inode; the
        cache's own file likewise) or ``"content"`` (every image's bytes and the whole cache
        read again).
      listing: a file that ``save_listing`` wrote for this folder with the same settings
        moments ago (a sweep's caller, for its workers): its file list and checked resize
        cache are used instead of listing the folder and checking the cache, unless the
        cache has changed since (then, or if it is missing, the folder is listed).

    Raises:
      ValueError: a class folder without a single image.
    """

    def __init__(self, root: str | os.PathLike, image_size: int | Sequence[int] = (224, 224),
                 include_subfolders: bool = True, on_error: str = "raise",
                 cache_dir: str | os.PathLike | None = None, workers: int | None = None, *,
                 storage_options: dict | None = None, fingerprint: str = "stat",
                 listing: str | os.PathLike | None = None):
        image_size = _check_image_size(image_size)
        _check_options(on_error, workers, include_subfolders, storage_options, root)
        if fingerprint not in FINGERPRINTS:
            raise ValueError(f"ImageFolder(fingerprint={fingerprint!r}): use one of "
                             f"{', '.join(FINGERPRINTS)}")
        source = scan_lib.open_source(root, storage_options, fingerprint)
        settings = {"root": source.location, "image_size": list(image_size),
                    "include_subfolders": include_subfolders, "on_error": on_error,
                    "fingerprint": fingerprint, "cache_dir": os.path.abspath(
                        os.fspath(cache_dir or cache_lib.default_cache_dir()))}
        found = None if listing is None else scan_lib.load_listing(listing, settings)
        scan = scan_lib.scan(source, include_subfolders, on_error, workers) if not found \
            else found[0]
        self._init_view(_Source(source, scan, settings, workers), None)
        if found:
            self._source.adopt(found[1], os.fspath(listing))

    def _init_view(self, source: "_Source", rows: np.ndarray | None) -> "ImageFolder":
        self._source = source
        self._rows = rows  # None: every usable file; else indices into the source's files
        self._images, self._images_lock = None, threading.Lock()
        return self

    @property
    def _index(self) -> np.ndarray:
        return self._source.usable() if self._rows is None else self._rows

    def __len__(self) -> int:
        return int(self._index.size)

    def __repr__(self) -> str:
        return (f"ImageFolder({self._source.root!r}, {len(self)} images, "
                f"{len(self.class_names)} classes, image_size={self.image_size})")

    @property
    def files(self) -> tuple[str, ...]:
        """Path or URL of every image, in row order (MATLAB ``imds.Files``)."""
        return tuple(self._source.scan.files[i] for i in self._index)

    @property
    def labels(self) -> np.ndarray:
        """int32 array (N,): the class index of every image (MATLAB ``imds.Labels``)."""
        labels = self._source.scan.labels[self._index]
        labels.flags.writeable = False
        return labels

    @property
    def class_names(self) -> tuple[str, ...]:
        """Sorted class folder names; label ``i`` is ``class_names[i]``."""
        return self._source.scan.class_names

    @property
    def skipped(self) -> tuple[tuple[str, str], ...]:
        """(path, reason) of every file of the whole folder that was left out."""
        return self._source.skipped()

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) of the cached images."""
        return self._source.image_size

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(H, W, 3), known without decoding anything."""
        return (*self._source.image_size, 3)

    @property
    def listed_from(self) -> str | None:
        """The ``listing`` file these images were opened from; None: this process listed them."""
        return self._source.listing

    def save_listing(self, path: str | os.PathLike) -> bool:
        """Write the folder's file list and its checked resize cache (built if needed) to
        ``path``, for processes that open the folder soon after with ``listing=path``.

        Returns:
          False, writing nothing, when the cache is not kept on disk (a read-only cache folder).
        """
        source = self._source
        return scan_lib.save_listing(path, source.scan, source.cache(), source.settings)

    @property
    def cache_path(self) -> str:
        """The ``.npy`` file of the resize cache (built if needed)."""
        return self._source.cache().path

    @property
    def images(self) -> np.ndarray:
        """uint8 (N, H, W, 3), read-only; built or opened from the cache on first access."""
        with self._images_lock:
            if self._images is None:
                self._images = self._source.cache().take(self._index)
            return self._images

    def read(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """uint8 (len(positions), H, W, 3): the images at ``positions``, read from the resize
        cache alone, so a set larger than memory can be streamed."""
        positions = np.asarray(positions, np.int64)
        with self._images_lock:
            if self._images is not None:
                return take_rows(self._images, positions)
        return take_rows(self._source.cache().images, self._index[positions])

    def row_moments(self) -> np.ndarray | None:
        """int64 (N, 2, 3): each image's per-channel pixel sum and sum of squares, stored with
        the resize cache when it was built (None for a cache without them), so that a streamed
        set's channel statistics need no pass over its images."""
        return self._stored("moments")

    def row_digests(self) -> np.ndarray | None:
        """uint64 (N,): each image's xxh3-64, stored with the resize cache when it was built
        (None for a cache without them), so that a checkpoint recognises a set on disk
        without reading it (``digests.set_digest``)."""
        return self._stored("digests")

    def _stored(self, kind: str) -> np.ndarray | None:
        """This view's rows of what the resize cache stores per image (``moments``,
        ``digests``), or None."""
        values = getattr(self._source.cache(), kind)
        return None if values is None else values[self._index]

    def subset(self, indices: Sequence[int] | np.ndarray) -> "ImageFolder":
        """The images at ``indices`` (ints in ``[0, len)``); MATLAB ``subset``. Shares the cache."""
        indices = np.asarray(indices)
        if indices.ndim != 1 or (indices.size and not np.issubdtype(indices.dtype, np.integer)):
            raise TypeError(f"subset: indices must be a 1-D sequence of ints; got "
                            f"{indices.dtype} with shape {indices.shape}")
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"subset: indices must lie in [0, {len(self)}); got values in "
                             f"[{indices.min()}, {indices.max()}]")
        rows = self._index[indices.astype(np.int64)]
        return ImageFolder.__new__(ImageFolder)._init_view(self._source, rows)

    def load(self) -> ImageSet:
        """An :class:`ImageSet` of these images (decoded now if needed); MATLAB ``readall``."""
        return ImageSet(self.images, self.labels, self.class_names)

    to_image_set = load


def _check_image_size(image_size) -> tuple[int, int]:
    size = (image_size, image_size) if isinstance(image_size, (int, np.integer)) else image_size
    try:
        size = tuple(size)
    except TypeError:
        size = ()
    if len(size) != 2 or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                                 and s > 0 for s in size):
        raise ValueError(f"image_size must be (height, width) with positive ints, or one int; "
                         f"got {image_size!r}")
    return int(size[0]), int(size[1])


def _check_options(on_error, workers, include_subfolders, storage_options, root) -> None:
    if on_error not in cache_lib.ON_ERROR:
        raise ValueError(f"on_error must be one of {cache_lib.ON_ERROR}; got {on_error!r}")
    if workers is not None and not (isinstance(workers, int) and workers >= 1):
        raise ValueError(f"workers must be a positive int or None; got {workers!r}")
    if not isinstance(include_subfolders, bool):
        raise TypeError(f"include_subfolders must be True or False; got {include_subfolders!r}")
    if storage_options is not None and not remote.is_url(root):
        raise ValueError(f"storage_options apply to URL roots only; {root!r} is a local path")


class _Source:
    """The scanned folder and its resize cache, shared by an ImageFolder and all its subsets."""

    def __init__(self, source, scan: scan_lib.Scan, settings: dict, workers: int | None):
        self.source, self.scan, self.settings, self.workers = source, scan, settings, workers
        self.image_size = tuple(settings["image_size"])
        self.cache_dir, self.on_error = settings["cache_dir"], settings["on_error"]
        self.root, self.listing = source.location, None
        self._cache = self._usable = None
        self._lock = threading.Lock()

    def adopt(self, cache: cache_lib.ResizeCache, listing: str) -> None:
        """Use ``cache``, checked by the process that wrote ``listing``."""
        with self._lock:
            self._use(cache)
            self.listing = listing

    def cache(self) -> cache_lib.ResizeCache:
        """Open or build the resize cache, once per process and folder."""
        with self._lock:
            if self._cache is None:
                cache = cache_lib.open_or_build(
                    self.scan.files, self.scan.fingerprints, self.source.read,
                    origin=self.root,
                    image_size=self.image_size, cache_dir=self.cache_dir, name=self.source.name,
                    workers=self.workers, on_error=self.on_error,
                    processes=None if isinstance(self.source, scan_lib.LocalFolder) else False,
                    verify=self.settings["fingerprint"] == "content")
                self._use(cache)
            return self._cache

    def _use(self, cache: cache_lib.ResizeCache) -> None:
        self._check_failed(cache.failed)
        keep = np.ones(len(self.scan.files), bool)
        keep[list(cache.failed)] = False
        self._usable, self._cache = np.flatnonzero(keep), cache

    def _check_failed(self, failed: dict[int, str]) -> None:
        if not failed:
            return
        lost = [(self.scan.files[i], why) for i, why in sorted(failed.items())]
        scan_lib.warn_skipped(self.root, lost, "undecodable image")
        left = np.bincount(np.delete(self.scan.labels, list(failed)),
                           minlength=len(self.scan.class_names))
        if (left == 0).any():
            name = self.scan.class_names[int(np.argmin(left))]
            raise ValueError(f"ImageFolder: class {name!r} has no decodable image left after "
                             f"skipping {len(failed)} files, e.g. {lost[0][0]} ({lost[0][1]})")

    def usable(self) -> np.ndarray:
        """Indices of the files that are (or, with on_error="raise", must be) decodable."""
        if self.on_error == "raise":
            return np.arange(len(self.scan.files))
        self.cache()
        return self._usable

    def skipped(self) -> tuple[tuple[str, str], ...]:
        failed = self.cache().failed if self.on_error == "skip" else {}
        return self.scan.skipped + tuple((self.scan.files[i], why)
                                         for i, why in sorted(failed.items()))
