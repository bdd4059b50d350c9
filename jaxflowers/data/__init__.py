"""Data: image sets and folders, the embedded digits, downloads, TFDS, on-device augmentation."""
from jaxflowers.data.augment import Augmentation
from jaxflowers.data.cache import decode_image
from jaxflowers.data.download import (ChecksumError, DownloadError, UnsafeArchiveError,
                                      download_and_extract, download_flowers)
from jaxflowers.data.embedded import digits
from jaxflowers.data.folder import ImageFolder
from jaxflowers.data.imageset import ImageSet
from jaxflowers.data.tfds import TfdsImages, tfds_source

__all__ = ["Augmentation", "ChecksumError", "DownloadError", "ImageFolder", "ImageSet",
           "TfdsImages", "UnsafeArchiveError", "decode_image", "digits", "download_and_extract",
           "download_flowers", "tfds_source"]
