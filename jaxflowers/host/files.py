"""File primitives the caches and the downloads share: a file's sha256, a JSON record
written atomically, and whether a folder can take new files."""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of the file at ``path``, read in chunks (memory stays flat)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_json_atomic(path: str | os.PathLike, record: dict) -> None:
    """Write ``record`` as JSON to ``path`` through a temporary file in the same folder, so
    a reader sees the old file or the whole new one, never half of it."""
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)  # ASCII: file names may hold undecodable bytes
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def unwritable(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` cannot take new files (created if missing), or None if it can.

    Tried, not guessed from permission bits, so a read-only mount, a file where a folder
    should be, and ``root`` (whom the mode does not stop) all get the true answer.
    """
    if os.path.exists(folder) and not os.path.isdir(folder):
        return "it is a file, not a folder"
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return error.strerror or str(error)
    return None
