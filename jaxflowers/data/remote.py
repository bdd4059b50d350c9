"""Class folders on object stores and web servers (``s3://``, ``gs://``, ``https://``) via fsspec.

:class:`RemoteFolder` offers ImageFolder a local folder's operations, fingerprinting files by
ETag, size and mtime. fsspec and the drivers are the extra ``jaxflowers[remote]``.
"""
from __future__ import annotations

import concurrent.futures
import json
import posixpath
import re

__all__ = ["RemoteFolder", "is_url"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_ETAG_KEYS = ("ETag", "etag", "md5Hash", "crc32c", "checksum")
_MTIME_KEYS = ("LastModified", "Last-Modified", "last_modified", "updated", "mtime", "modified")


def is_url(root) -> bool:
    """True for a ``scheme://...`` string other than ``file://``."""
    return isinstance(root, str) and bool(_URL.match(root)) and not root.startswith("file://")


def _import_fsspec(url: str):
    try:
        import fsspec
    except ImportError as exc:
        raise ImportError(f"reading {url} needs fsspec and the driver for its protocol; "
                          "pip install jaxflowers[remote]") from exc
    return fsspec


class RemoteFolder:
    """A folder on any fsspec file system (``storage_options`` are its kwargs), as class folders."""

    def __init__(self, url: str, storage_options: dict | None = None):
        fsspec = _import_fsspec(url)
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        except (ImportError, ValueError) as exc:  # unknown protocol or its driver missing
            raise ImportError(f"cannot open {url}: {exc}; pip install jaxflowers[remote] "
                              "(and the fsspec driver for this protocol)") from exc
        self.location = url
        self.name = posixpath.basename(self.root.rstrip("/")) or "remote"
        if not self.fs.isdir(self.root):
            raise FileNotFoundError(f"ImageFolder: root {url!r} does not exist or is not a folder")

    def top(self) -> tuple[list[tuple[str, str]], list[str]]:
        """([(class name, folder path)] sorted by name, [URLs of files directly in root])."""
        entries = self.fs.ls(self.root, detail=True)
        dirs, files = [], []
        for entry in entries:
            base = posixpath.basename(entry["name"].rstrip("/"))
            if base.startswith(".") or entry["name"].rstrip("/") == self.root.rstrip("/"):
                continue
            if entry["type"] == "directory":
                dirs.append((base, entry["name"]))
            else:
                files.append(self.fs.unstrip_protocol(entry["name"]))
        return sorted(dirs), sorted(files)

    def files(self, folder: str, recursive: bool) -> list[tuple[str, int | None, str, str]]:
        """[(URL, size or None, fingerprint, problem "")] of the files under ``folder``."""
        found = self.fs.find(folder, maxdepth=None if recursive else 1, detail=True)
        found = {path: info for path, info in sorted(found.items())
                 if info.get("type") != "directory" and not path.endswith("/")
                 and not any(part.startswith(".") for part in path[len(folder):].split("/"))}
        bare = [path for path, info in found.items() if _fingerprint(info) == _NOTHING]
        if bare:  # e.g. an https listing gives names only: ask each file (HEAD) in parallel
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                found.update(zip(bare, pool.map(self.fs.info, bare)))
        return [(self.fs.unstrip_protocol(path), info.get("size"), _fingerprint(info), "")
                for path, info in found.items()]

    def read(self, url: str) -> bytes:
        """The bytes of one file (a URL returned by :meth:`files`)."""
        return self.fs.cat_file(url)


def _fingerprint(info: dict) -> str:
    """Size, ETag (or hash) and modification time, as far as the store reports them."""
    etag = next((info[k] for k in _ETAG_KEYS if info.get(k)), None)
    mtime = next((info[k] for k in _MTIME_KEYS if info.get(k)), None)
    return json.dumps([info.get("size"), etag, mtime], default=str)


_NOTHING = _fingerprint({})
