"""Data: image sets and folders, the embedded digits, downloads, TFDS, on-device augmentation.

Names load on first use (PEP 562), as in the top-level package: only ``Augmentation``
needs JAX, so a sweep's caller can build resize caches with ``ImageFolder`` and the
cache's decode processes can start without importing it.
"""
from jaxflowers.host.lazy import lazy_names

_EXPORTS = {
    "Augmentation": "jaxflowers.data.augment", "decode_image": "jaxflowers.data.imread",
    "ChecksumError": "jaxflowers.data.download", "DownloadError": "jaxflowers.data.download",
    "UnsafeArchiveError": "jaxflowers.data.download",
    "download_and_extract": "jaxflowers.data.download",
    "download_flowers": "jaxflowers.data.download", "digits": "jaxflowers.data.embedded",
    "ImageFolder": "jaxflowers.data.folder", "ImageSet": "jaxflowers.data.imageset",
    "TfdsImages": "jaxflowers.data.tfds", "tfds_source": "jaxflowers.data.tfds",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_names(__name__, globals(), _EXPORTS)
