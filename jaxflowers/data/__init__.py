"""Data: image sets and folders, the embedded digits, downloads, TFDS, on-device augmentation.

Names load on first use (``lazy_loader``): only ``Augmentation`` needs JAX, so a sweep's
caller can build resize caches with ``ImageFolder`` and the cache's decode processes start
without importing it.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "augment": ["Augmentation"],
    "download": ["ChecksumError", "DownloadError", "UnsafeArchiveError",
                 "download_and_extract", "download_flowers"],
    "embedded": ["digits"],
    "folder": ["ImageFolder"],
    "imageset": ["ImageSet"],
    "imread": ["decode_image"],
    "tfds": ["TfdsImages", "tfds_source"],
})
