"""Data: image sets, the embedded digits, on-device augmentation and resident loading."""
from jaxflowers.data.augment import Augmentation
from jaxflowers.data.embedded import digits
from jaxflowers.data.imageset import ImageSet

__all__ = ["Augmentation", "ImageSet", "digits"]
