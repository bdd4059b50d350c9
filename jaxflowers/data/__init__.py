"""Data: image sets and folders, the embedded digits, downloads, TFDS, on-device augmentation.

Names load on first use: only ``Augmentation`` needs JAX, which decode processes must not load.
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
