"""Files written whole or not at all, and whether a folder can take new files.

``write_atomic`` is the one way to write a file a reader might see half-written: a fsynced
temporary file beside it, renamed over it.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import pathlib
import secrets
import tempfile
from typing import Callable

__all__ = ["sha256_file", "unwritable", "write_atomic", "write_json_atomic"]


def write_atomic(path: str | os.PathLike, content: bytes | str | Callable) -> pathlib.Path:
    """Write ``content`` (bytes, text, or ``f(binary_file)``) to ``path`` atomically; the Path."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "it is a folder", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(tmp, "wb") as file:
            if callable(content):
                content(file)
            else:
                file.write(content.encode() if isinstance(content, str) else content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json_atomic(path: str | os.PathLike, record) -> pathlib.Path:
    """``record`` as indented JSON (ASCII: names may hold undecodable bytes), atomically."""
    return write_atomic(path, json.dumps(record, indent=1) + "\n")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of the file at ``path``, read in chunks (memory stays flat)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def unwritable(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` cannot take new files (created if missing), or None; tried, not guessed."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        return "it is a file, not a folder"
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return error.strerror or str(error)
    return None
