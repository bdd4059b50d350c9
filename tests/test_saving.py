"""Saved networks (``TrainedNet.save``, ``jaxflowers.load``): one safetensors file, checked
on reading, no pickle; files of jaxflowers 0.1 still load."""
import json
import os
import pathlib
import re
import struct

import jax
import numpy as np
import pytest

import jaxflowers as jf

FIXTURES = pathlib.Path(__file__).with_name("fixtures")
# Scores jaxflowers 0.1 gave (one CPU device) for the network it saved as
# fixtures/cifar_net-v1.zip on the images of _fixture_images(): loading that file must
# reproduce them, to bfloat16's rounding (the network computes in bfloat16; XLA's fusion on
# 4 fake devices rounds differently).
V1_SCORES = [[0.14711536, 0.48805878, 0.36482587], [0.14680064, 0.48701465, 0.36618474],
             [0.15268964, 0.47959337, 0.367717], [0.1486469, 0.47983807, 0.37151504]]


def _fixture_images():
    return np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)


def tiny_net(model=None, classes=("cat", "dog")) -> "jf.TrainedNet":
    """``model`` (default a two-class cifar_net(1)) on 32x32 images with random weights:
    shapes from ``eval_shape``, so nothing is compiled to make it."""
    model = model or jf.models.cifar_net(1, num_classes=len(classes))
    shapes = jax.eval_shape(lambda x: model.init(jax.random.PRNGKey(0), x, train=False),
                            jax.ShapeDtypeStruct((1, 32, 32, 3), np.float32))
    rng = np.random.default_rng(0)
    variables = jax.tree.map(lambda s: rng.normal(0.2, 0.1, s.shape).astype(s.dtype), shapes)
    return jf.TrainedNet(model=model, variables=variables, class_names=classes,
                         normalization=(np.full(3, 120, np.float32), np.full(3, 60, np.float32)),
                         input_shape=(32, 32, 3))


@pytest.fixture(scope="module")
def trained():
    return tiny_net()


def test_a_loaded_network_predicts_exactly_as_the_saved_one(trained, tmp_path):
    path = trained.save(tmp_path / "new" / "digits.net")  # the folder is created
    assert path == tmp_path / "new" / "digits.net" and os.listdir(path.parent) == ["digits.net"]
    loaded = jf.load(path)
    assert loaded.model == trained.model and loaded.class_names == trained.class_names
    assert loaded.input_shape == trained.input_shape
    images = _fixture_images()
    np.testing.assert_array_equal(jf.predict(loaded, images), jf.predict(trained, images))
    assert repr(loaded) == ("TrainedNet(cifar_net(depth=1, num_classes=2), 2 classes, input "
                            "(32, 32, 3), float32)")


def test_the_file_is_safetensors_with_the_model_as_its_registry_spec(trained, tmp_path):
    from safetensors import safe_open

    with safe_open(str(trained.save(tmp_path / "net.safetensors")), framework="numpy") as f:
        description = json.loads(f.metadata()["jaxflowers"])
        keys = set(f.keys())
    assert description["model"] == ["cifar_net", {"depth": 1, "num_classes": 2}]
    assert description["version"] == 2 and description["class_names"] == ["cat", "dog"]
    assert "variables/params/Dense_0/kernel" in keys and "normalization/1" in keys


def test_a_custom_bfloat16_resnet_survives_saving(tmp_path):
    model = jf.models.ResNet(stage_sizes=(1, 1), block_cls=jf.models.BottleneckBlock,
                             num_classes=2, num_filters=4, dtype=jax.numpy.bfloat16)
    net = tiny_net(model)
    loaded = jf.load(net.save(tmp_path / "resnet.net"))
    assert loaded.model == net.model and loaded.dtype == jax.numpy.bfloat16
    assert jax.tree.structure(loaded.variables) == jax.tree.structure(net.variables)
    for saved, back in zip(jax.tree.leaves(net.variables), jax.tree.leaves(loaded.variables)):
        assert back.dtype == saved.dtype and back.tobytes() == saved.tobytes()


def test_a_network_saved_by_jaxflowers_0_1_loads_and_predicts_as_it_did(tmp_path):
    net = jf.load(FIXTURES / "cifar_net-v1.zip")
    assert net.class_names == ("cat", "dog", "emu") and net.dtype == jax.numpy.bfloat16
    scores = jf.predict(net, _fixture_images())
    np.testing.assert_allclose(scores, V1_SCORES, atol=4e-3)
    again = jf.load(net.save(tmp_path / "converted.net"))  # now in the current format
    np.testing.assert_array_equal(jf.predict(again, _fixture_images()), scores)


def _flip_a_data_byte(path):
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01  # a tensor's byte: the header stays valid
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-200])


def _header(change):
    """Damage that keeps the file a valid safetensors file: its description rewritten."""
    def damage(path):
        data = path.read_bytes()
        size = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + size])
        description = json.loads(header["__metadata__"]["jaxflowers"])
        change(description)
        header["__metadata__"]["jaxflowers"] = json.dumps(description)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + size:])
    return damage


def _broken_header(path):
    data = bytearray(path.read_bytes())
    data[12:20] = b"\x00\xff{{}}]["
    path.write_bytes(bytes(data))


def _zip_damage(path):
    """A file that starts like a 0.1 network (a zip) but whose archive is broken."""
    data = (FIXTURES / "cifar_net-v1.zip").read_bytes()
    path.write_bytes(data[:40] + b"\xff" * 64 + data[104:])


@pytest.mark.parametrize("damage, message", [
    (_flip_a_data_byte, r"cannot load .*digits\.net: its tensors do not match their digest"),
    (_truncate, r"cannot load .*digits\.net: damaged or not a saved network"),
    (lambda p: p.write_text("weights, honestly"), r"digits\.net: damaged or not a saved"),
    (_broken_header, r"cannot load .*digits\.net: damaged or not a saved network"),
    (_header(lambda d: d.update(version=99)), r"digits\.net: it has format version 99; this "
                                              r"jaxflowers reads version 2"),
    (_header(lambda d: d.update(format="other")), r"digits\.net: its header does not describe"),
    (_header(lambda d: d.update(model=["os:system", {}])),
     r"digits\.net does not describe a network jaxflowers can build: ValueError: model "
     r"'os:system' is not one of"),
    (_header(lambda d: d.update(model=["cifar_net", {"depth": "x"}])),
     r"digits\.net does not describe a network jaxflowers can build"),
    (_zip_damage, r"digits\.net: a zip file, but not an intact network of jaxflowers 0\.1"),
], ids=["flipped data byte", "truncated", "not safetensors", "broken header", "newer version",
        "other format", "foreign model", "bad model field", "damaged zip"])
def test_a_damaged_network_file_is_a_value_error_naming_it(trained, tmp_path, damage, message):
    path = trained.save(tmp_path / "digits.net")
    damage(path)
    with pytest.raises(ValueError, match=message):
        jf.load(path)


def test_bad_network_paths_are_named(trained, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no saved network at {re.escape(str(tmp_path))}"):
        jf.load(tmp_path / "missing.net")
    with pytest.raises(IsADirectoryError, match="is a folder, not a saved network file"):
        jf.load(tmp_path)
    with pytest.raises(IsADirectoryError, match="cannot save the network to .*: it is a folder"):
        trained.save(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match=re.escape(str(blocker))):
        trained.save(blocker / "net.net")


def test_a_network_of_a_model_outside_jaxflowers_is_not_saved(tmp_path):
    import flax.linen as nn

    class Linear(nn.Module):
        @nn.compact
        def __call__(self, x, train=False):
            return nn.Dense(2)(x.reshape(x.shape[0], -1))

    net = tiny_net(Linear())
    with pytest.raises(TypeError, match=r"cannot save the network to .*foreign\.net: .*Linear "
                                        r"is not a network of jaxflowers\.models"):
        net.save(tmp_path / "foreign.net")
    assert os.listdir(tmp_path) == []


def test_a_failed_save_keeps_the_previous_file(trained, tmp_path, monkeypatch):
    path = trained.save(tmp_path / "digits.net")
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        trained.save(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["digits.net"]
