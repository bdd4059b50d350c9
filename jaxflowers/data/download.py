"""Download an archive through pooch (sha256-checked, retried), then extract it safely.

The whole archive is refused if one member is unsafe; it is extracted into a temporary folder in
``dest`` and renamed into place. A marker naming the hash lets a later call skip the network.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
from pathlib import PurePosixPath, PureWindowsPath

from jaxflowers.host.files import write_json_atomic

__all__ = ["ChecksumError", "DownloadError", "FLOWERS_CLASSES", "FLOWERS_SHA256", "FLOWERS_URL",
           "UnsafeArchiveError", "download_and_extract", "download_flowers"]

FLOWERS_URL = "https://download.tensorflow.org/example_images/flower_photos.tgz"
# sha256 of flower_photos.tgz (228,813,984 bytes) as pinned by TensorFlow Datasets for
# tf_flowers: tensorflow_datasets/datasets/tf_flowers/checksums.tsv (tensorflow-datasets
# 4.9.10); the same value appears in other projects that verify this archive.
FLOWERS_SHA256 = "4c54ace7911aaffe13a365c34f650e71dd5bf1be0a58b464e5a7183e3e595d9c"
FLOWERS_CLASSES = ("daisy", "dandelion", "roses", "sunflowers", "tulips")
_POOCH_SCHEMES = ("http", "https", "ftp")


class DownloadError(OSError):
    """The download failed for good (HTTP error, or every retry used up)."""


class ChecksumError(ValueError):
    """The downloaded file's sha256 is not the expected one."""


class UnsafeArchiveError(ValueError):
    """An archive member would land outside the destination, or is a special file."""


def download_flowers(dest: str | os.PathLike, *, url: str = FLOWERS_URL,
                     sha256: str = FLOWERS_SHA256, retries: int = 3,
                     progress: bool = True) -> pathlib.Path:
    """Download and extract the Flowers photos; the MATLAB example's ``websave`` + ``untar``.

    ``url`` may be a mirror or ``file://``; the other arguments are :func:`download_and_extract`'s.
    Returns ``dest / "flower_photos"``, holding the five class folders, ready for ``ImageFolder``.
    """
    root = download_and_extract(url, dest, sha256=sha256, retries=retries,
                                progress=progress) / "flower_photos"
    if not root.is_dir():
        raise FileNotFoundError(f"the archive from {url} has no flower_photos/ folder")
    return root


def download_and_extract(url: str, dest: str | os.PathLike, *, sha256: str,
                         retries: int = 3, progress: bool = True, timeout: float = 60.0,
                         keep_archive: bool = False) -> pathlib.Path:
    """Download a tar archive (any compression), verify it, and extract it into ``dest``.

    Args:
      url: ``http(s)://``, ``ftp://``, ``file://`` or an fsspec URL of a tar archive.
      dest: destination folder (``tar -C dest -xf``); created if missing.
      sha256: expected hex digest of the archive.
      retries: retries of a failed or damaged transfer.
      progress: show a progress bar where stderr is a terminal.
      timeout: seconds a connection may stall.
      keep_archive: keep ``dest/<archive name>`` after extracting it.

    Returns:
      ``dest`` as a ``pathlib.Path``.

    Raises:
      DownloadError, ChecksumError: the transfer failed, or its sha256 differs (file deleted).
      UnsafeArchiveError: an absolute or ``..`` name, a special file, or a link leaving its folder.
      ValueError: the URL scheme is not supported, or the file is no tar archive.
    """
    sha256 = _check_sha256(sha256)
    dest = _prepare_dest(dest)
    name = _archive_name(url)
    marker = dest / f".{name}.extracted.json"
    if _is_extracted(marker, sha256):
        return dest
    archive = _fetch(url, dest / name, sha256=sha256, retries=retries,
                     progress=progress and sys.stderr.isatty(), timeout=timeout)
    entries = _extract_safely(archive, dest)
    write_json_atomic(marker, {"url": url, "sha256": sha256, "entries": entries})
    if not keep_archive:
        archive.unlink()
    return dest


def _fetch(url: str, archive: pathlib.Path, *, sha256: str, retries: int, progress: bool,
           timeout: float) -> pathlib.Path:
    """``archive``, downloaded through pooch unless present (pooch checks its hash too)."""
    import pooch
    import requests

    pooch.get_logger().setLevel("WARNING")  # its "Downloading ..." notes: the bar says it
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    downloader = (_http(progress, timeout) if scheme in ("http", "https")
                  else None if scheme == "ftp" else _fsspec_copy)
    registry = pooch.create(path=archive.parent, base_url="", retry_if_failed=retries,
                            registry={archive.name: f"sha256:{sha256}"},
                            urls={archive.name: url})
    try:
        return pathlib.Path(registry.fetch(archive.name, downloader=downloader))
    except ValueError as error:
        if "hash" not in str(error).lower():
            raise
        raise ChecksumError(f"sha256 mismatch for {url}: expected {sha256}; {error}; the file "
                            "was deleted and nothing was extracted") from None
    except (requests.RequestException, OSError) as error:
        raise DownloadError(f"downloading {url} failed after {retries + 1} attempt(s): "
                            f"{error}") from error


def _http(progress: bool, timeout: float):
    """pooch's HTTP downloader, failing at once on a client error (retrying cannot help)."""
    import pooch
    import requests

    fetch = pooch.HTTPDownloader(progressbar=progress, timeout=timeout)

    def download(url, output_file, registry):
        try:
            fetch(url, output_file, registry)
        except requests.HTTPError as error:
            status = error.response.status_code if error.response is not None else 0
            if 400 <= status < 500 and status not in (408, 425, 429):
                raise DownloadError(f"downloading {url} failed: {error}") from None
            raise
    return download


def _fsspec_copy(url: str, output_file, _pooch) -> None:
    """A pooch downloader for ``file://`` and the protocols fsspec knows."""
    if urllib.parse.urlsplit(url).scheme.lower() == "file":
        source = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
        shutil.copyfile(source, output_file)
        return
    import fsspec

    with fsspec.open(url, "rb") as stream, open(output_file, "wb") as out:
        shutil.copyfileobj(stream, out, 1 << 20)


def _check_sha256(sha256: str) -> str:
    digest = str(sha256).strip().lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"sha256 must be 64 hex digits; got {sha256!r}")
    return digest


def _prepare_dest(dest: str | os.PathLike) -> pathlib.Path:
    dest = pathlib.Path(dest).expanduser()
    if dest.exists() and not dest.is_dir():
        raise NotADirectoryError(f"dest {str(dest)!r} is a file; give a folder to download into")
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def _archive_name(url: str) -> str:
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in (*_POOCH_SCHEMES, "file") and not _fsspec_knows(scheme):
        raise ValueError(f"unsupported URL scheme {scheme!r} in {url!r}; use https://, "
                         "http://, ftp://, file:// or a protocol known to fsspec (pip install "
                         "fsspec)")
    name = PurePosixPath(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name
    return name or "download"


def _fsspec_knows(scheme: str) -> bool:
    if not scheme:
        return False
    try:
        import fsspec
    except ImportError:
        return False
    return scheme in fsspec.available_protocols()


def _is_extracted(marker: pathlib.Path, sha256: str) -> bool:
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return (record.get("sha256") == sha256 and
            all((marker.parent / e).exists() for e in record.get("entries", [])))


# ---------------------------------------------------------------- safe extraction

def _extract_safely(archive: pathlib.Path, dest: pathlib.Path) -> list[str]:
    """Check, extract into a temporary folder, rename into ``dest``; the sorted top names."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{archive.name}.extracting-", dir=dest))
    try:
        _extract_checked(archive, tmp)
        entries = sorted(p.name for p in tmp.iterdir())
        for name in entries:  # an earlier, interrupted call may have left some behind
            _remove(dest / name)
            os.replace(tmp / name, dest / name)
        return entries
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract_checked(archive: pathlib.Path, into: pathlib.Path) -> None:
    try:
        tar = tarfile.open(archive, "r:*")
    except tarfile.ReadError as err:
        raise ValueError(f"{archive} is not a tar archive ({err})") from err
    with tar:
        members = tar.getmembers()
        for member in members:
            problem = _member_problem(member)
            if problem:
                raise UnsafeArchiveError(f"refusing to extract {archive.name}: member "
                                         f"{member.name!r} {problem}; nothing was extracted")
        # filter="data" (Python 3.11.4+, 3.12+) is a second line behind the checks above.
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(into, members=members, **kwargs)


def _member_problem(member: tarfile.TarInfo) -> str | None:
    """Why ``member`` is unsafe to extract, or None if it is a plain file/folder/inner link."""
    if _leaves_folder(member.name):
        return "has an absolute path or a '..' component"
    if member.issym() or member.islnk():
        if _leaves_folder(member.linkname):
            kind = "symlink" if member.issym() else "hard link"
            return (f"is a {kind} to {member.linkname!r}; links may only point into their own "
                    "folder or below (no absolute target, no '..')")
    elif not (member.isreg() or member.isdir()):
        return "is a device file, FIFO or other special file"
    return None


def _leaves_folder(name: str) -> bool:
    """True for absolute or ``..`` names; without those, no chain of links can climb out."""
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    return (not name or posix.is_absolute() or bool(windows.drive or windows.root)
            or ".." in posix.parts or ".." in windows.parts)


def _remove(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
