"""Listing a folder of class folders: its images, their fingerprints and labels (``Scan``),
and a scan saved for other processes (``save_listing``, ``load_listing``): a sweep's workers
open the caller's checked scan and resize cache instead of listing the folder again.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import stat
import time
import warnings
from typing import NamedTuple, Sequence

import numpy as np

from jaxflowers.data import cache as cache_lib
from jaxflowers.data import decode, remote

__all__ = ["FINGERPRINTS", "IMAGE_EXTENSIONS", "LocalFolder", "Scan", "load_listing",
           "open_source", "save_listing", "scan", "warn_skipped"]

FINGERPRINTS = ("stat", "content")
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".dib", ".gif",
                              ".webp", ".tif", ".tiff"})


def open_source(root, storage_options, fingerprint: str = "stat"):
    """What lists and reads ``root``: a :class:`LocalFolder`, or a ``RemoteFolder`` for a URL."""
    if remote.is_url(root):
        return remote.RemoteFolder(root, storage_options)
    path = os.fspath(root)
    return LocalFolder(path[len("file://"):] if path.startswith("file://") else path,
                        fingerprint)


class LocalFolder:
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
    return path, st.st_size, cache_lib.file_stamp(st), ""


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _is_image(path: str) -> bool:
    """Whether the file name's extension is an image's: ``os.path.splitext``'s rule for names
    not starting with a dot (those are never listed), in a third of its time."""
    dot = path.rfind(".")
    return dot > max(path.rfind("/"), path.rfind(os.sep)) + 1 and \
        path[dot:].lower() in IMAGE_EXTENSIONS


class Scan(NamedTuple):
    files: tuple[str, ...]
    fingerprints: tuple[str, ...]
    labels: np.ndarray  # int32 (N,)
    class_names: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]


def scan(source, recursive: bool, on_error: str, workers: int | None) -> Scan:
    """List ``source``'s class folders and sort their files into images and not."""
    dirs, root_files = source.top()
    if not dirs:
        hint = (f"; it holds {len(root_files)} files but images must sit in class folders "
                "(root/<class>/<image>)") if root_files else ""
        raise ValueError(f"ImageFolder: no class folders in {source.location!r}{hint}")
    listings = _list_class_folders(source, [folder for _, folder in dirs], recursive, workers)
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
    warn_skipped(source.location, skipped, "non-image file")
    warn_skipped(source.location, bad, "unreadable image")
    return Scan(tuple(files), tuple(fingerprints), np.asarray(labels, np.int32),
                 tuple(name for name, _ in dirs), tuple(skipped + bad))


# A local folder whose first class folder listed within this many seconds (per folder, plus
# per file) is listed in one thread: there the listing is mostly Python, and threads would only
# take turns holding the GIL (and slow each other down). Slower metadata (a network file
# system, a cold disk) and remote folders are listed in ``workers`` threads.
FAST_LISTING_S_PER_FOLDER, FAST_LISTING_S_PER_FILE = 2e-3, 50e-6


def _list_class_folders(source, folders: list[str], recursive: bool,
                        workers: int | None) -> list[list]:
    """``source.files`` of each of ``folders``, in order."""
    list_one = lambda folder: source.files(folder, recursive)  # noqa: E731
    workers = workers or decode.default_workers()
    if workers == 1:
        return [list_one(folder) for folder in folders]
    first = []
    if isinstance(source, LocalFolder):
        start = time.perf_counter()
        first = [list_one(folders[0])]
        took = time.perf_counter() - start
        if took < FAST_LISTING_S_PER_FOLDER + FAST_LISTING_S_PER_FILE * len(first[0]):
            return first + [list_one(folder) for folder in folders[1:]]
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        return first + list(ex.map(list_one, folders[len(first):]))


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


def warn_skipped(root: str, skipped: Sequence[tuple[str, str]], what: str) -> None:
    """One warning naming how many ``(path, reason)`` were left out of ``root``, and the first."""
    if skipped:
        warnings.warn(f"ImageFolder({root!r}): skipped {len(skipped)} {what}(s), e.g. "
                      f"{skipped[0][0]} ({skipped[0][1]}); see .skipped", stacklevel=4)


LISTING_FORMAT = 1  # change it when the listing's fields change: older listings are ignored


def save_listing(path: str | os.PathLike, scan: Scan, cache: cache_lib.ResizeCache,
                 settings: dict) -> bool:
    """Write ``scan`` and its checked resize ``cache`` to ``path`` (JSON, atomically), with the
    ``settings`` (root, image size, fingerprint, ...) that must match where it is loaded.
    False (nothing written) when the cache is not kept on disk."""
    from jaxflowers.host.files import write_atomic

    if not cache.stamp or not os.path.exists(cache.path):
        return False
    write_atomic(path, json.dumps({
        "format": LISTING_FORMAT, "settings": settings, "files": list(scan.files),
        "fingerprints": list(scan.fingerprints), "labels": scan.labels.tolist(),
        "class_names": list(scan.class_names), "skipped": [list(s) for s in scan.skipped],
        "cache": {"path": cache.path, "stamp": cache.stamp, "shape": list(cache.images.shape),
                  "failed": {str(k): v for k, v in cache.failed.items()}}}))
    return True


def load_listing(path: str | os.PathLike,
                 settings: dict) -> tuple[Scan, cache_lib.ResizeCache] | None:
    """The scan and cache of a listing saved with these ``settings``; None if the file is
    missing or unreadable, the settings differ, or the cache changed since it was checked."""
    try:
        with open(path, encoding="utf-8") as f:
            listing = json.load(f)
        if listing.get("format") != LISTING_FORMAT or listing.get("settings") != settings:
            return None
        found, labels = listing["cache"], np.asarray(listing["labels"], np.int32)
        scan = Scan(tuple(listing["files"]), tuple(listing["fingerprints"]), labels,
                    tuple(listing["class_names"]), tuple(map(tuple, listing["skipped"])))
        failed = {int(k): v for k, v in found["failed"].items()}
        if not (len(scan.files) == len(scan.fingerprints) == labels.size == found["shape"][0]):
            return None
        cache = cache_lib.reopen(found["path"], found["stamp"], found["shape"], failed)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    return None if cache is None else (scan, cache)
