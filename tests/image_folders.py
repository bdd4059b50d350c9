"""Small PNG class folders that tests build on the fly (for ImageFolder, the cache, the CLI)."""
import pathlib

from PIL import Image


def class_folders(root: pathlib.Path, per_class: int = 3, classes=("a", "b"), size=(9, 7)):
    """PNG class folders; class c's image i is the colour (100 c, 20 i, 50)."""
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.new("RGB", size, (100 * c, 20 * i, 50)).save(root / name / f"{i}.png")
    return root


def expected_colours(per_class: int = 3, classes: int = 2) -> list[list[int]]:
    """The RGB colour of each image of ``class_folders``, in the folders' order."""
    return [[100 * c, 20 * i, 50] for c in range(classes) for i in range(per_class)]


def save_image(path: pathlib.Path, color=(200, 30, 30), size=(12, 10), mode="RGB", **kwargs):
    """Write a uniform ``mode`` image of PIL ``size`` (width, height) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path, **kwargs)
    return path
