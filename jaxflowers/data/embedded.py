"""The offline real data set: scikit-learn's bundled handwritten digits, upscaled (bicubic)."""
from __future__ import annotations

import gzip
import importlib.util
import pathlib

import numpy as np
from PIL import Image

from jaxflowers.data.imageset import ImageSet

__all__ = ["digits"]


def digits(image_size: tuple[int, int] = (32, 32)) -> ImageSet:
    """scikit-learn's 8x8 digits as an ``ImageSet``: uint8 (1797, H, W, 3) at ``image_size``."""
    images, target = _digits_8x8()
    small = np.clip(np.rint(images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    height, width = image_size
    big = np.stack([
        np.asarray(Image.fromarray(img).resize((width, height), Image.Resampling.BICUBIC))
        for img in small])
    rgb = np.repeat(big[..., None], 3, axis=-1)
    return ImageSet(rgb, target.astype(np.int32), tuple(str(d) for d in range(10)))


def _digits_8x8() -> tuple[np.ndarray, np.ndarray]:
    """float (1797, 8, 8) pixels 0-16 and int labels, as ``sklearn.datasets.load_digits``."""
    # The file load_digits reads, read without importing scikit-learn (1-1.5 s a process).
    spec = importlib.util.find_spec("sklearn")
    if spec and spec.origin:
        file = pathlib.Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if file.is_file():
            with gzip.open(file, "rt") as f:
                table = np.loadtxt(f, delimiter=",")
            return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images, bunch.target
