"""ImageFolder: MATLAB's ``imageDatastore(..., LabelSource="foldernames")``, resized once.

Layout ``root/<class>/<image>``; names starting with "." are ignored. Construction only lists
files; the first read of ``images`` decodes them into :mod:`jaxflowers.data.cache`, which subsets
share. With ``on_error="skip"``, ``files``, ``labels`` and ``len()`` need the cache built first.
"""
from __future__ import annotations

import concurrent.futures
import os
import stat
import threading
import warnings
from typing import NamedTuple, Sequence

import numpy as np

from jaxflowers.data import cache as cache_lib
from jaxflowers.data import remote
from jaxflowers.data.imageset import ImageSet, Labelled

__all__ = ["FINGERPRINTS", "IMAGE_EXTENSIONS", "ImageFolder"]

FINGERPRINTS = ("stat", "content")
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".dib", ".gif",
                              ".webp", ".tif", ".tiff"})


class ImageFolder(Labelled):
    """Images in class folders, resized once and memory-mapped; MATLAB's ``imageDatastore``.

    Args:
      root: a local folder or an fsspec URL (``s3://``, ``gs://``, ``https://``).
      image_size: (height, width) every image is resized to, or one int.
      include_subfolders: find images at any depth below each class folder.
      on_error: ``"raise"`` (``OSError`` naming the file) or ``"skip"`` (listed in ``skipped``).
      cache_dir: default ``$JAXFLOWERS_CACHE_DIR`` or ``~/.cache/jaxflowers``.
      workers: listing and decoding threads (or processes).
      storage_options: keyword arguments for the fsspec file system of a URL root.
      fingerprint: how the cache sees a changed file: ``"stat"`` or ``"content"`` (its bytes).

    Raises:
      ValueError: a class folder without a single image.
    """

    def __init__(self, root: str | os.PathLike, image_size: int | Sequence[int] = (224, 224),
                 include_subfolders: bool = True, on_error: str = "raise",
                 cache_dir: str | os.PathLike | None = None, workers: int | None = None, *,
                 storage_options: dict | None = None, fingerprint: str = "stat"):
        image_size = _check_image_size(image_size)
        _check_options(on_error, workers, include_subfolders, storage_options, root)
        if fingerprint not in FINGERPRINTS:
            raise ValueError(f"ImageFolder(fingerprint={fingerprint!r}): use one of "
                             f"{', '.join(FINGERPRINTS)}")
        source = _open_source(root, storage_options, fingerprint)
        scan = _scan(source, include_subfolders, on_error, workers)
        self._init_view(_Source(source, scan, image_size, cache_dir, workers, on_error), None)

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
                return self._images[positions]
        return self._source.cache().images[self._index[positions]]

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


def _open_source(root, storage_options, fingerprint: str = "stat"):
    if remote.is_url(root):
        return remote.RemoteFolder(root, storage_options)
    path = os.fspath(root)
    return _LocalFolder(path[len("file://"):] if path.startswith("file://") else path,
                        fingerprint)


class _LocalFolder:
    """A local folder with the interface of :class:`remote.RemoteFolder`."""

    def __init__(self, root: str, fingerprint: str = "stat"):
        self.root, self.fingerprint = os.path.abspath(root), fingerprint
        if not os.path.exists(self.root):
            raise FileNotFoundError(f"ImageFolder: root {root!r} does not exist")
        if not os.path.isdir(self.root):
            raise NotADirectoryError(f"ImageFolder: root {root!r} is not a folder")
        self.name = os.path.basename(self.root) or "images"
        self.location = self.root

    def top(self) -> tuple[list[tuple[str, str]], list[str]]:
        """([(class name, folder)] sorted by name, [files directly in root])."""
        with os.scandir(self.root) as entries:
            entries = sorted((e for e in entries if not e.name.startswith(".")),
                             key=lambda e: e.name)
        dirs = [(e.name, e.path) for e in entries if e.is_dir()]  # follows symlinks
        return dirs, [e.path for e in entries if not e.is_dir()]

    def files(self, folder: str, recursive: bool) -> list[tuple[str, int | None, str, str]]:
        """[(path, size, fingerprint, problem)] under ``folder``, sorted; links kept inside it."""
        base = os.path.realpath(folder)
        root = os.path.realpath(self.root)
        if root == base or root.startswith(base.rstrip(os.sep) + os.sep):  # an endless walk
            raise ValueError(f"ImageFolder: class folder {folder!r} leads to {base!r}, which "
                             f"holds the data root {self.root!r}; a class folder must hold "
                             "only its own images")
        seen, stack, out = set(), [folder], []
        while stack:
            current = stack.pop()
            st = os.stat(current)
            if (st.st_dev, st.st_ino) in seen:  # a symlink loop, or two links to one folder
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(current) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    if not entry.is_dir():
                        out.append(_stat_file(entry.path, self.fingerprint))
                    elif recursive and entry.is_symlink() and not _inside(
                            os.path.realpath(entry.path), base):
                        out.append((entry.path, None, "", "a link to a folder outside its "
                                    "class folder, not followed"))
                    elif recursive:
                        stack.append(entry.path)
        return sorted(out)

    def read(self, path: str) -> bytes:
        return _read_file(path)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _stat_file(path: str, fingerprint: str = "stat") -> tuple[str, int | None, str, str]:
    """(path, size, fingerprint, problem) of one file."""
    try:
        st = os.stat(path)
    except OSError as exc:  # e.g. a dangling symlink
        return path, None, "", f"{type(exc).__name__}: {exc}"
    if not stat.S_ISREG(st.st_mode):
        return path, None, "", "not a regular file"
    if fingerprint == "content":
        import xxhash
        try:
            return path, st.st_size, xxhash.xxh3_128_hexdigest(_read_file(path)), ""
        except OSError as exc:
            return path, None, "", f"{type(exc).__name__}: {exc}"
    # inode and ctime: ``cp -p``, tar and ``rsync -a`` replace a file keeping size and mtime
    return path, st.st_size, f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}", ""


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _is_image(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in IMAGE_EXTENSIONS


class _Scan(NamedTuple):
    files: tuple[str, ...]
    fingerprints: tuple[str, ...]
    labels: np.ndarray  # int32 (N,)
    class_names: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]


def _scan(source, recursive: bool, on_error: str, workers: int | None) -> _Scan:
    """List ``source``'s class folders in parallel and sort their files into images and not."""
    dirs, root_files = source.top()
    if not dirs:
        hint = (f"; it holds {len(root_files)} files but images must sit in class folders "
                "(root/<class>/<image>)") if root_files else ""
        raise ValueError(f"ImageFolder: no class folders in {source.location!r}{hint}")
    with concurrent.futures.ThreadPoolExecutor(workers or cache_lib.default_workers()) as ex:
        listings = list(ex.map(lambda d: source.files(d[1], recursive), dirs))
    skipped = [(p, "not inside a class folder") for p in root_files if _is_image(p)]
    files, fingerprints, labels, bad = [], [], [], []
    for label, ((name, folder), listing) in enumerate(zip(dirs, listings)):
        found = _sort_listing(listing, skipped, bad)
        if not found:
            raise ValueError(_empty_class_message(name, folder, listing, recursive))
        files += [path for path, _ in found]
        fingerprints += [fp for _, fp in found]
        labels += [label] * len(found)
    if bad and on_error == "raise":
        raise OSError(f"cannot read image {bad[0][0]}: {bad[0][1]}; "
                      "pass on_error='skip' to leave such files out")
    _warn_skipped(source.location, skipped, "non-image file")
    _warn_skipped(source.location, bad, "unreadable image")
    return _Scan(tuple(files), tuple(fingerprints), np.asarray(labels, np.int32),
                 tuple(name for name, _ in dirs), tuple(skipped + bad))


def _sort_listing(listing, skipped: list, bad: list) -> list[tuple[str, str]]:
    """(path, fingerprint) of the images; appends non-images to ``skipped``, empties to ``bad``."""
    found = []
    for path, size, fingerprint, problem in listing:
        if not _is_image(path):
            skipped.append((path, problem or "not an image file (by extension)"))
        elif problem or size == 0:
            bad.append((path, problem or "file is empty (0 bytes)"))
        else:
            found.append((path, fingerprint))
    return found


def _empty_class_message(name, folder, listing, recursive) -> str:
    message = f"ImageFolder: class folder {folder!r} ({name!r}) contains no image files"
    if listing:
        message += f" ({len(listing)} other or unreadable files, e.g. {listing[0][0]!r})"
    elif not recursive:
        message += "; images in its sub-folders need include_subfolders=True"
    return message + f"; extensions read: {', '.join(sorted(IMAGE_EXTENSIONS))}"


def _warn_skipped(root: str, skipped: Sequence[tuple[str, str]], what: str) -> None:
    if skipped:
        warnings.warn(f"ImageFolder({root!r}): skipped {len(skipped)} {what}(s), e.g. "
                      f"{skipped[0][0]} ({skipped[0][1]}); see .skipped", stacklevel=4)


class _Source:
    """The scanned folder and its resize cache, shared by an ImageFolder and all its subsets."""

    def __init__(self, source, scan: _Scan, image_size, cache_dir, workers, on_error):
        self.source, self.scan, self.image_size = source, scan, image_size
        self.cache_dir, self.workers, self.on_error = cache_dir, workers, on_error
        self.root = source.location
        self._cache = self._usable = None
        self._lock = threading.Lock()

    def cache(self) -> cache_lib.ResizeCache:
        """Open or build the resize cache, once per process and folder."""
        with self._lock:
            if self._cache is None:
                cache = cache_lib.open_or_build(
                    self.scan.files, self.scan.fingerprints, self.source.read,
                    origin=self.root,
                    image_size=self.image_size, cache_dir=self.cache_dir, name=self.source.name,
                    workers=self.workers, on_error=self.on_error,
                    processes=None if isinstance(self.source, _LocalFolder) else False)
                self._check_failed(cache.failed)
                keep = np.ones(len(self.scan.files), bool)
                keep[list(cache.failed)] = False
                self._usable, self._cache = np.flatnonzero(keep), cache
            return self._cache

    def _check_failed(self, failed: dict[int, str]) -> None:
        if not failed:
            return
        lost = [(self.scan.files[i], why) for i, why in sorted(failed.items())]
        _warn_skipped(self.root, lost, "undecodable image")
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
