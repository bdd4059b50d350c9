"""Download an archive with resume, retries and a sha256 check, then extract it safely.

``download_flowers`` fetches the 218 MB Flowers archive the MATLAB example uses;
``download_and_extract`` does the work for any tar archive. The steps, each safe to
interrupt:

1. stream the URL into ``dest/<name>.part`` (tqdm bar), resuming a partial file with an
   HTTP ``Range`` request and retrying transient failures with exponential backoff;
2. check the sha256 of the whole file; a mismatch deletes it and raises ``ChecksumError``;
3. check every member (no absolute paths, no ``..``, links only downwards, no device
   files), refusing the whole archive if one fails, then extract with tarfile's
   ``filter="data"`` into a temporary folder inside ``dest`` and rename into place;
4. write a marker file naming the hash. A later call that finds the marker and the
   extracted folders returns at once, without touching the network.

URLs may be ``http(s)://``, ``file://`` or, with fsspec installed, any protocol fsspec
knows (``gs://``, ``s3://``, ``memory://``...). Two processes must not download into the
same ``dest`` at the same time (they would share the ``.part`` file).
"""
from __future__ import annotations

import http.client
import json
import os
import pathlib
import shutil
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import PurePosixPath, PureWindowsPath

from tqdm.auto import tqdm

from jaxflowers.host.files import sha256_file, write_json_atomic

FLOWERS_URL = "http://download.tensorflow.org/example_images/flower_photos.tgz"
# sha256 of flower_photos.tgz (228,813,984 bytes) as pinned by TensorFlow Datasets for
# tf_flowers: tensorflow_datasets/datasets/tf_flowers/checksums.tsv (tensorflow-datasets
# 4.9.10); the same value appears in other projects that verify this archive.
FLOWERS_SHA256 = "4c54ace7911aaffe13a365c34f650e71dd5bf1be0a58b464e5a7183e3e595d9c"
FLOWERS_CLASSES = ("daisy", "dandelion", "roses", "sunflowers", "tulips")

_CHUNK = 1 << 20
_MAX_BACKOFF_S = 60.0
_RETRY_HTTP_CODES = {408, 425, 429, 500, 502, 503, 504}


class DownloadError(OSError):
    """The download failed for good (HTTP error, or every retry used up)."""


class ChecksumError(ValueError):
    """The downloaded file's sha256 is not the expected one."""


class UnsafeArchiveError(ValueError):
    """An archive member would land outside the destination, or is a special file."""


class _Truncated(OSError):
    """The connection closed before the announced number of bytes arrived."""


def download_flowers(dest: str | os.PathLike, *, url: str = FLOWERS_URL,
                     sha256: str = FLOWERS_SHA256, retries: int = 3,
                     progress: bool = True) -> pathlib.Path:
    """Download and extract the Flowers photos (3,670 JPEGs in 5 class folders).

    The MATLAB example's ``websave`` + ``untar`` of ``flower_photos.tgz``, with a sha256
    check and safe, resumable, idempotent extraction (see ``download_and_extract``).

    Args:
      dest: folder to download into; created if missing.
      url: where to fetch the archive (a mirror, or ``file://`` for a local copy).
      sha256: expected hex digest of the archive.
      retries: how many times to retry after a transient failure.
      progress: show a tqdm progress bar.

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
                         retries: int = 3, progress: bool = True, backoff: float = 1.0,
                         timeout: float = 60.0, keep_archive: bool = False) -> pathlib.Path:
    """Download a tar archive (any compression), verify it, and extract it into ``dest``.

    Like ``tar -C dest -xf archive``: a member ``a/b.jpg`` ends up at ``dest/a/b.jpg``.
    Unsafe archives are refused as a whole (``UnsafeArchiveError``, nothing extracted):
    absolute member names, ``..`` components, special files (devices, FIFOs), and
    symbolic or hard links whose target is absolute or contains ``..``. Links may only
    point into their own folder or below; that rule is checked here on every Python
    version, and tarfile's ``filter="data"`` is applied on top where it exists.

    Args:
      url: ``http(s)://``, ``file://`` or an fsspec URL of a tar archive.
      dest: destination folder; created if missing; must not be a file.
      sha256: expected hex digest of the archive (case-insensitive).
      retries: retries after a transient failure (connection lost, timeout, HTTP 5xx,
        short transfer); each resumes from the bytes already on disk.
      progress: show a tqdm progress bar.
      backoff: seconds before the first retry; doubled on each further retry (max 60).
      timeout: socket timeout in seconds.
      keep_archive: keep ``dest/<archive name>`` after extracting it.

    Returns:
      ``dest`` as a ``pathlib.Path``.

    Raises:
      DownloadError: HTTP error, or still failing after ``retries`` retries (the
        ``.part`` file stays, so the next call resumes).
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
    archive = dest / name
    if not (archive.is_file() and sha256_file(archive) == sha256):
        _download(url, archive, sha256=sha256, retries=retries, progress=progress,
                  backoff=backoff, timeout=timeout)
    entries = _extract_safely(archive, dest)
    write_json_atomic(marker, {"url": url, "sha256": sha256, "entries": entries})
    if not keep_archive:
        archive.unlink()
    return dest


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
    if scheme not in ("http", "https", "file") and not _fsspec_knows(scheme):
        raise ValueError(f"unsupported URL scheme {scheme!r} in {url!r}; use http://, "
                         "https://, file:// or a protocol known to fsspec (pip install fsspec)")
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


# ---------------------------------------------------------------- download + verify

def _download(url: str, archive: pathlib.Path, *, sha256: str, retries: int,
              progress: bool, backoff: float, timeout: float) -> None:
    """Fetch ``url`` into ``archive`` via ``archive.part``, with retries; verify sha256."""
    part = archive.with_name(archive.name + ".part")
    for attempt in range(retries + 1):
        try:
            _fetch_once(url, part, timeout=timeout, progress=progress)
            break
        except _RETRYABLE as err:
            if not _is_retryable(err):
                raise DownloadError(f"downloading {url} failed: {err}") from err
            if attempt == retries:
                raise DownloadError(
                    f"downloading {url} failed after {retries + 1} attempts: {err}; "
                    f"{part} keeps the {_size(part)} bytes received, a later call resumes") from err
            time.sleep(min(backoff * 2 ** attempt, _MAX_BACKOFF_S))
    actual = sha256_file(part)
    if actual != sha256:
        part.unlink()
        raise ChecksumError(f"sha256 mismatch for {url}: expected {sha256}, got {actual}; "
                            f"the file was deleted and nothing was extracted")
    os.replace(part, archive)


_RETRYABLE = (urllib.error.URLError, http.client.HTTPException, ConnectionError,
              TimeoutError, _Truncated)


def _is_retryable(err: BaseException) -> bool:
    if isinstance(err, urllib.error.HTTPError):
        return err.code in _RETRY_HTTP_CODES
    # file:// of a missing file will not appear by retrying
    return not isinstance(getattr(err, "reason", None), FileNotFoundError)


def _size(path: pathlib.Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _fetch_once(url: str, part: pathlib.Path, *, timeout: float, progress: bool) -> None:
    """Append the rest of ``url`` to ``part`` (or rewrite it if the server cannot resume)."""
    offset = _size(part)
    stream, start, total = _open(url, offset, timeout)
    with stream, open(part, "r+b" if part.exists() else "wb") as out:
        out.seek(start)
        out.truncate()
        bar = tqdm(total=total, initial=start, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=part.name.removesuffix(".part"), disable=not progress, leave=False)
        with bar:
            while chunk := stream.read(_CHUNK):
                out.write(chunk)
                bar.update(len(chunk))
        received = out.tell()
    if total is not None and received < total:
        raise _Truncated(f"connection closed after {received} of {total} bytes")


def _open(url: str, offset: int, timeout: float):
    """Open ``url`` from byte ``offset`` if the server allows it.

    Returns:
      (readable stream, byte position it starts at: ``offset`` or 0, total size or None).
    """
    if urllib.parse.urlsplit(url).scheme.lower() not in ("http", "https", "file"):
        return _open_fsspec(url, offset)
    headers = {"User-Agent": "jaxflowers"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                      timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code != 416:  # 416: the .part already holds the whole file (or more)
            raise
        return _EmptyStream(), offset, offset
    length = resp.headers.get("Content-Length")
    length = int(length) if length is not None else None
    resumed = (getattr(resp, "status", None) == 206 and
               resp.headers.get("Content-Range", "").startswith(f"bytes {offset}-"))
    start = offset if resumed else 0  # a server that ignores Range sends it all again
    return resp, start, None if length is None else start + length


def _open_fsspec(url: str, offset: int):
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    total = fs.size(path)
    stream = fs.open(path, "rb")
    stream.seek(min(offset, total))
    return stream, min(offset, total), total


class _EmptyStream:
    def read(self, _n: int = -1) -> bytes:
        return b""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


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
