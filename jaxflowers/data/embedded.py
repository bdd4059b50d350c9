"""The offline real data set: scikit-learn's bundled handwritten digits.

Data sets cannot be downloaded on build machines, so the main job, the accuracy tests and
the notebooks' CI runs use the 1,797 real 8x8 digit scans that ship inside scikit-learn.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from jaxflowers.data.imageset import ImageSet


def digits(image_size: tuple[int, int] = (32, 32)) -> ImageSet:
    """scikit-learn's handwritten digits (1,797 real images, 10 classes) as an RGB image set.

    The 8x8 images (grey levels 0-16) are scaled to 0-255, upscaled with bicubic
    interpolation to ``image_size`` and repeated over three channels, so they fit the
    CIFAR-shaped networks. No download: the data ship with scikit-learn.

    Args:
      image_size: (height, width) of the returned images.

    Returns:
      An ``ImageSet`` with uint8 images (1797, H, W, 3), labels 0-9 and class names "0"-"9".
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    small = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    height, width = image_size
    big = np.stack([
        np.asarray(Image.fromarray(img).resize((width, height), Image.Resampling.BICUBIC))
        for img in small])
    rgb = np.repeat(big[..., None], 3, axis=-1)
    return ImageSet(rgb, bunch.target.astype(np.int32), tuple(str(d) for d in range(10)))
