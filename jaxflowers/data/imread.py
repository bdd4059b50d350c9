"""Decode image files into the rows of a resize cache: MATLAB's ``imresize(imread(f))``."""
from __future__ import annotations

import io
import math
import os
from typing import Callable, Mapping, Sequence

import numpy as np
from PIL import Image, ImageOps

__all__ = ["decode_image", "decode_rows", "failure_reason", "read_error", "resize"]

_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def decode_image(data: bytes, image_size: tuple[int, int]) -> np.ndarray:
    """Decode an image to 8-bit RGB and resize it; MATLAB's ``imresize(imread(f), [h w])``.

    EXIF orientation is applied, alpha dropped, the aspect ratio not kept (Lanczos).

    Args:
      data: the bytes of a JPEG, PNG, BMP, GIF (first frame), WebP or TIFF file.
      image_size: (height, width) of the result.

    Returns:
      uint8 (height, width, 3); ``ValueError`` if empty, ``OSError`` (PIL's) if truncated.
    """
    if not data:
        raise ValueError("file is empty (0 bytes)")
    with Image.open(io.BytesIO(data)) as img:
        img.load()  # decode everything now: a truncated file must fail here, not pass as grey
        ImageOps.exif_transpose(img, in_place=True)
        return np.asarray(resize(_to_rgb(img), image_size), dtype=np.uint8)


def resize(img: Image.Image, image_size: tuple[int, int]) -> Image.Image:
    """``img`` at (height, width), Lanczos: the one resize every data source uses."""
    height, width = image_size
    return img if img.size == (width, height) else img.resize((width, height),
                                                               Image.Resampling.LANCZOS)


def _to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB of any PIL mode; 16-bit gray is scaled (PIL's own convert would clip it)."""
    if img.mode in _SIXTEEN_BIT_MODES:
        wide = np.clip(np.asarray(img).astype(np.int64), 0, 65535)
        return Image.fromarray(((wide + 128) // 257).astype(np.uint8), "L").convert("RGB")
    if img.mode == "F":
        return Image.fromarray(np.clip(np.asarray(img), 0, 255).round().astype(np.uint8)
                               ).convert("RGB")
    if img.mode in ("P", "PA"):  # via RGBA: palette transparency would otherwise warn
        img = img.convert("RGBA")
    return img if img.mode == "RGB" else img.convert("RGB")


def read_error(file: str, reason: str) -> OSError:
    """The error of ``on_error="raise"`` for a file that could not be read or decoded."""
    return OSError(f"cannot read image {file}: {reason}; "
                   "pass on_error='skip' to leave such files out")


def failure_reason(exc: BaseException) -> str:
    """How ``ResizeCache.failed`` words the error of one file: ``"OSError: ..."``."""
    return f"{type(exc).__name__}: {exc}"


def decode_rows(fd: int, offset: int, files: Sequence[str] | Mapping[int, str],
                read: Callable[[str], bytes], shape: tuple[int, ...],
                rows: range) -> dict[int, Exception]:
    """Decode ``rows`` (``files[row]`` each) into the file ``fd``; ``{row: exception}``."""
    failed = {}
    for row in rows:
        try:
            image = decode_image(read(files[row]), shape[1:3])  # module lookup: tests count it
        except Exception as exc:  # any reader or decoder error belongs to this one file
            failed[row] = exc
            continue
        os.pwrite(fd, image.tobytes(), offset + row * math.prod(shape[1:]))  # disk full: abort
    return failed
