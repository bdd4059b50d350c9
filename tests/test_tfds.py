"""tfds.py under ``tfds.testing.mock_data``, with TensorFlow blocked.

Why the metadata fixture: mock_data works without TensorFlow for ``tfds.data_source``, but
the PyPI wheel of tensorflow-datasets ships no ``testing/metadata`` folder, so the default
policy falls back to ``MockPolicy.USE_CODE``. There the data set looks unprepared (its
data_dir is a non-existing folder) and cifar10's class names are "0".."9": the real names
are only read from ``batches.meta.txt`` while preparing. So, as mock_data's docs advise,
we give it the metadata a prepared data set has (``dataset_info.json``, ``features.json``,
``label.labels.txt``), written by tfds itself, and use ``MockPolicy.USE_FILES``; only the
records are mocked.
"""
from __future__ import annotations

import importlib.util
import pickle
import sys

import numpy as np
import pytest
from PIL import Image

tfds = pytest.importorskip(
    "tensorflow_datasets",
    reason='tensorflow-datasets is not installed (pip install "jaxflowers[tfds]")')

from jaxflowers.data import (  # noqa: E402
    ImageSet,  # noqa: E402
    TfdsImages,
    tfds_source,
)

N = 6
# CIFAR-10's batches.meta.txt, which tfds reads into label.labels.txt when preparing.
CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                 "ship", "truck")
FLOWER_NAMES = ("dandelion", "daisy", "tulips", "sunflowers", "roses")  # tf_flowers' code


@pytest.fixture(autouse=True)
def no_tensorflow(monkeypatch):
    """Every test here runs as if TensorFlow were absent, even where it is installed."""
    monkeypatch.setitem(sys.modules, "tensorflow", None)


def _write_metadata(root, name: str, label_names=None, splits=("train", "test")) -> None:
    """Write what preparing ``name`` leaves besides the records (split sizes = N)."""
    builder = tfds.builder(name, data_dir=root, file_format="array_record")
    if label_names is not None:
        builder.info.features["label"].names = list(label_names)
    builder.info.set_splits(tfds.core.SplitDict([
        tfds.core.SplitInfo(name=s, shard_lengths=[N], num_bytes=0,
                            filename_template=tfds.core.ShardedFileTemplate(
                                data_dir=builder.data_dir, dataset_name=name, split=s,
                                filetype_suffix="array_record"))
        for s in splits]))
    builder.data_path.mkdir(parents=True, exist_ok=True)
    builder.info.write_to_directory(builder.data_dir)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfds")
    _write_metadata(root, "cifar10", CIFAR10_NAMES)
    _write_metadata(root, "tf_flowers", splits=("train",))
    _write_metadata(root, "mnist")
    return root


@pytest.fixture
def mocked(data_dir):
    with tfds.testing.mock_data(num_examples=N, policy=tfds.testing.MockPolicy.USE_FILES,
                                data_dir=str(data_dir)):
        yield data_dir


def _raw(name: str, data_dir, split="train"):
    """The mocked examples straight from tfds, to compare against."""
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False)


def test_tensorflow_is_blocked_here():
    assert importlib.util.find_spec("tensorflow") is None
    with pytest.raises(ImportError):
        import tensorflow  # noqa: F401


def test_cifar10_gives_an_image_set(mocked):
    images = tfds_source("cifar10", data_dir=mocked)
    assert isinstance(images, ImageSet)
    assert images.images.shape == (N, 32, 32, 3) and images.images.dtype == np.uint8
    assert images.labels.dtype == np.int32 and set(images.labels) <= set(range(10))
    assert images.class_names == CIFAR10_NAMES
    raw = _raw("cifar10", mocked)
    for i in range(N):
        np.testing.assert_array_equal(images.images[i], raw[i]["image"])
        assert images.labels[i] == raw[i]["label"]
    assert len(tfds_source("cifar10", "test", data_dir=mocked)) == N


@pytest.mark.parametrize("size", [(64, 64), (64, 48)])
def test_tf_flowers_is_resized_with_pil(mocked, size):
    images = tfds_source("tf_flowers", data_dir=mocked, image_size=size)
    assert images.images.shape == (N, *size, 3) and images.images.dtype == np.uint8
    assert images.class_names == FLOWER_NAMES
    raw = _raw("tf_flowers", mocked)
    assert len({raw[i]["image"].shape for i in range(N)}) > 1  # sizes really do vary
    expected = np.asarray(Image.fromarray(raw[2]["image"]).resize(size[::-1],
                                                                  Image.Resampling.LANCZOS))
    np.testing.assert_array_equal(images.images[2], expected)


def test_variable_size_set_without_image_size_raises(mocked):
    with pytest.raises(ValueError, match=r"varying size.*image_size=\(height, width\)"):
        tfds_source("tf_flowers", data_dir=mocked)


def test_grey_images_keep_one_channel(mocked):
    images = tfds_source("mnist", data_dir=mocked, image_size=(32, 32))
    assert images.images.shape == (N, 32, 32, 1) and len(images.class_names) == 10


def test_stream_for_grain(mocked):
    grain = pytest.importorskip("grain")
    stream = tfds_source("tf_flowers", data_dir=mocked, image_size=(64, 64), as_stream=True)
    assert isinstance(stream, TfdsImages) and len(stream) == N
    item = stream[3]
    assert item["image"].shape == (64, 64, 3) and item["image"].dtype == np.uint8
    assert isinstance(item["label"], int) and 0 <= item["label"] < 5
    assert item["label"] == _raw("tf_flowers", mocked)[3]["label"]
    clone = pickle.loads(pickle.dumps(stream))  # grain workers receive it pickled
    np.testing.assert_array_equal(clone[3]["image"], item["image"])
    batch = grain.MapDataset.source(stream).batch(4)[0]
    assert batch["image"].shape == (4, 64, 64, 3) and batch["label"].shape == (4,)


def test_unprepared_set_without_tensorflow_names_data_dir(tmp_path):
    empty = tmp_path / "tfds_data"
    with pytest.raises(RuntimeError, match="needs TensorFlow") as err:
        tfds_source("cifar10", data_dir=empty)
    assert str(empty) in str(err.value) and "jaxflowers[tfds-prepare]" in str(err.value)


def test_missing_tensorflow_datasets_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r'pip install "jaxflowers\[tfds\]"'):
        tfds_source("cifar10")


def test_set_without_image_or_label_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs an 'image' and a 'label'"):
        tfds_source("imdb_reviews", data_dir=tmp_path)


@pytest.mark.parametrize("size", [(0, 32), (32,), (32, 32, 3)])
def test_bad_image_size_is_refused(size):
    with pytest.raises(ValueError, match="image_size"):
        tfds_source("cifar10", image_size=size)
