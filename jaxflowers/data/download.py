"""Download an archive through pooch (sha256-checked, retried), then extract it safely.

``download_flowers`` fetches the 218 MB Flowers archive the MATLAB example uses;
``download_and_extract`` does the work for any tar archive:

1. pooch streams the URL into a temporary file beside the destination (tqdm bar when
   stderr is a terminal), checks its sha256 and moves it into place, retrying a failed or
   damaged transfer; a bad file is deleted (``ChecksumError``);
2. every member is checked (no absolute paths, no ``..``, links only downwards, no device
   files), and the whole archive refused if one fails; then it is extracted with
   tarfile's ``filter="data"`` into a temporary folder inside ``dest`` and renamed into
   place;
3. a marker file names the hash: a later call that finds it and the extracted folders
   returns at once, without touching the network.

URLs may be ``http(s)://``, ``ftp://`` (pooch's), ``file://`` or, with fsspec installed,
any protocol fsspec knows (``gs://``, ``s3://``, ``memory://``...).
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
    """Download and extract the Flowers photos (3,670 JPEGs in 5 class folders).

    The MATLAB example's ``websave`` + ``untar`` of ``flower_photos.tgz``, with a sha256
    check and safe, idempotent extraction (see ``download_and_extract``).

    Args:
      dest: folder to download into; created if missing.
      url: where to fetch the archive (a mirror, or ``file://`` for a local copy).
      sha256: expected hex digest of the archive.
      retries: how many times to retry a failed or damaged transfer.
      progress: show a progress bar (only where stderr is a terminal).

    Returns:
      ``dest / "flower_photos"``, the folder holding the class folders (daisy, dandelion,
      roses, sunflowers, tulips), ready for ``ImageFolder``.
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

    Like ``tar -C dest -xf archive``: a member ``a/b.jpg`` ends up at ``dest/a/b.jpg``.
    Unsafe archives are refused as a whole (``UnsafeArchiveError``, nothing extracted):
    absolute member names, ``..`` components, special files (devices, FIFOs), and
    symbolic or hard links whose target is absolute or contains ``..``. Links may only
    point into their own folder or below; that rule is checked here on every Python
    version, and tarfile's ``filter="data"`` is applied on top where it exists.

    Args:
      url: ``http(s)://``, ``ftp://``, ``file://`` or an fsspec URL of a tar archive.
      dest: destination folder; created if missing; must not be a file.
      sha256: expected hex digest of the archive (case-insensitive).
      retries: retries of a failed or damaged transfer (each starts again from zero).
      progress: show a progress bar where stderr is a terminal.
      timeout: seconds a connection may stall.
      keep_archive: keep ``dest/<archive name>`` after extracting it.

    Returns:
      ``dest`` as a ``pathlib.Path``.

    Raises:
      DownloadError: an HTTP or connection error, after ``retries`` retries.
      ChecksumError: the sha256 differs; the bad file is deleted, nothing is extracted.
      UnsafeArchiveError: see above.
      NotADirectoryError: ``dest`` is a file.
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
    """``archive``, downloaded through pooch unless it is already there (pooch checks the
    hash of a file present too)."""
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
    """pooch's HTTP downloader, except that a client error (404, 403...) fails at once:
    retrying cannot make a missing file appear."""
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
    """True when ``marker`` records ``sha256`` and every folder it lists still exists."""
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return (record.get("sha256") == sha256 and
            all((marker.parent / e).exists() for e in record.get("entries", [])))


# ---------------------------------------------------------------- safe extraction

def _extract_safely(archive: pathlib.Path, dest: pathlib.Path) -> list[str]:
    """Check every member, extract into a temporary folder in ``dest``, rename into place.

    Returns:
      The sorted top-level names the archive created in ``dest``.
    """
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
    """True for names that could resolve outside the folder they are relative to.

    Without '..' and without an absolute start every name, and every link target, points
    to the same folder or below; so a chain of such links cannot climb out either.
    """
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    return (not name or posix.is_absolute() or bool(windows.drive or windows.root)
            or ".." in posix.parts or ".." in windows.parts)


def _remove(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
