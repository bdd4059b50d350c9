"""The offline real data set: scikit-learn's bundled handwritten digits, upscaled (bicubic)."""
from __future__ import annotations

import numpy as np
from PIL import Image

from jaxflowers.data.imageset import ImageSet

__all__ = ["digits"]


def digits(image_size: tuple[int, int] = (32, 32)) -> ImageSet:
    """scikit-learn's 8x8 digits as an ``ImageSet``: uint8 (1797, H, W, 3) at ``image_size``."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    small = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    height, width = image_size
    big = np.stack([
        np.asarray(Image.fromarray(img).resize((width, height), Image.Resampling.BICUBIC))
        for img in small])
    rgb = np.repeat(big[..., None], 3, axis=-1)
    return ImageSet(rgb, bunch.target.astype(np.int32), tuple(str(d) for d in range(10)))
