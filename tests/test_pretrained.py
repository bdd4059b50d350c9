"""torchvision/timm ResNet weights: ``models.pretrained`` reproduces torch's logits, keeps or
replaces the head, and refuses other files in one line naming the file and the tensor.

The fixtures are torchvision's own ResNet classes with narrow stages and random weights
(``tests/fixtures/make_resnet_fixtures.py``, run once with torch); their JSON holds the
images and torch's float64 logits, torchvision's ImageNet normalisation applied."""
import base64
import json
import pathlib
import sys

import numpy as np
import pytest

import jaxflowers as jf

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
# fixture: (spec of the same network, classes of its head)
NETS = {"resnet_bottleneck_tiny": (("resnet", {"stage_sizes": [1, 1, 1, 1],
                                               "block": "bottleneck", "num_filters": 8}), 5),
        "resnet_basic_tiny": (("resnet", {"stage_sizes": [2, 1, 1, 1], "block": "basic",
                                          "num_filters": 8}), 7)}


def reference(name):
    """(uint8 images (N, H, W, 3), torch's logits (N, classes)) of a fixture."""
    ref = json.loads((FIXTURES / f"{name}.json").read_text())
    images = np.frombuffer(base64.b64decode(ref["images"]), np.uint8).reshape(ref["shape"])
    return images, np.asarray(ref["logits"])


def weights(name):
    return FIXTURES / f"{name}.safetensors"


def _at(tree, keys):
    for key in keys:
        tree = tree[key]
    return tree


def logits(pretrained, images):
    mean, std = pretrained.normalization
    x = (images.astype(np.float32) - mean) / std
    return np.asarray(pretrained.model.apply(pretrained.variables, x, train=False))


@pytest.mark.parametrize("name", NETS)
@pytest.mark.parametrize("stem", ["space_to_depth", "conv"])
def test_torch_logits_are_reproduced(name, stem):
    spec, classes = NETS[name]
    net = jf.models.pretrained(spec, weights=weights(name), stem=stem)
    assert net.model.num_classes == classes and not net.fresh_head
    images, want = reference(name)
    np.testing.assert_allclose(logits(net, images), want, atol=1e-4, rtol=0)


def test_factories_take_weights_and_a_new_class_count_gets_a_fresh_head():
    spec, classes = NETS["resnet_basic_tiny"]
    kept = jf.models.resnet(spec[1]["stage_sizes"], "basic", classes, num_filters=8,
                            weights=weights("resnet_basic_tiny"))
    assert isinstance(kept, jf.models.Pretrained) and not kept.fresh_head
    fresh = jf.models.pretrained(spec, 3, weights=weights("resnet_basic_tiny"))
    assert fresh.fresh_head and fresh.model.num_classes == 3
    assert "head" not in fresh.variables["params"]
    with pytest.raises(ValueError, match="head is fresh"):
        jf.TrainedNet.from_pretrained(fresh)
    assert jf.TrainedNet.from_pretrained(kept).class_names == tuple("0123456")
    for module in (("conv_init",), ("BasicBlock_2", "Conv_0")):  # the rest is the file's
        np.testing.assert_array_equal(_at(fresh.variables["params"], module)["kernel"],
                                      _at(kept.variables["params"], module)["kernel"])
    np.testing.assert_allclose(fresh.normalization[0], [123.675, 116.28, 103.53], rtol=1e-6)


def test_another_architecture_or_depth_names_the_file_and_first_tensor():
    basic, bottleneck = weights("resnet_basic_tiny"), weights("resnet_bottleneck_tiny")
    spec = NETS["resnet_bottleneck_tiny"][0]
    with pytest.raises(ValueError, match=r"resnet_basic_tiny.safetensors is not a resnet of "
                                         r"stages \(1, 1, 1, 1\) \(bottleneck blocks\), 8 "
                                         r"first-stage filters: it has no tensor "
                                         r"'layer1.0.bn3.bias' \(for "
                                         r"BottleneckBlock_0/BatchNorm_2/bias\)"):
        jf.models.pretrained(spec, weights=basic)
    shallower = ("resnet", {"stage_sizes": [1, 1, 1, 1], "block": "basic", "num_filters": 8})
    with pytest.raises(ValueError, match=r"has tensor 'layer1.1.bn1.bias', which the network "
                                         r"lacks \(10 such"):
        jf.models.pretrained(shallower, weights=basic)
    with pytest.raises(ValueError, match=r"is not a resnet50: tensor 'layer1.0.bn1.bias' has "
                                         r"shape \(8,\), the network's BottleneckBlock_0/"
                                         r"BatchNorm_0/bias needs \(64,\)"):
        jf.models.resnet50(weights=bottleneck)


def test_truncated_file_missing_file_and_bad_class_count(tmp_path):
    whole = weights("resnet_bottleneck_tiny").read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(whole[: len(whole) // 2])
    spec = NETS["resnet_bottleneck_tiny"][0]
    with pytest.raises(ValueError, match=r"cannot read weights from .*cut.safetensors: not a "
                                         "complete safetensors file"):
        jf.models.pretrained(spec, weights=cut)
    with pytest.raises(FileNotFoundError, match="no weights file at .*absent.safetensors"):
        jf.models.pretrained(spec, weights=tmp_path / "absent.safetensors")
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match=f"num_classes={bad!r} must be a positive"):
            jf.models.pretrained(spec, bad, weights=weights("resnet_bottleneck_tiny"))


def test_a_pth_file_without_torch_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    path = tmp_path / "resnet50.pth"
    path.write_bytes(b"PK\x03\x04 not read")
    with pytest.raises(ValueError, match=r"cannot read .*resnet50.pth: a torch file needs "
                                         r"torch \(pip install torch\)"):
        jf.models.resnet50(weights=path)


def test_a_pth_state_dict_loads_like_its_safetensors(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    path = tmp_path / "net.pth"
    torch.save(load_file(weights("resnet_bottleneck_tiny")), path)
    spec, _ = NETS["resnet_bottleneck_tiny"]
    images, want = reference("resnet_bottleneck_tiny")
    np.testing.assert_allclose(logits(jf.models.pretrained(spec, weights=path), images), want,
                               atol=1e-4, rtol=0)


def test_flowers_pretrained_recipe_fine_tunes_with_the_head_at_ten_times():
    from jaxflowers import recipes

    recipe = recipes.recipe("flowers-pretrained")
    assert recipe.needs_weights and recipe.data == "flowers" and recipe.model == "resnet50"
    opts = recipe.options(2, 3303)
    assert (opts.solver, opts.mini_batch_size, opts.learn_rate) == ("adam", 256, 2e-4)
    assert opts.learn_rate_factors == (("head", 10.0),)
    assert opts.augmentation == recipes.augmentation("flowers")
    assert recipes.recipe_for("digits", weights=True) is recipe


def test_train_command_refuses_a_recipe_without_weights_and_the_wrong_file(capsys):
    from jaxflowers.cli import main

    assert main(["train", "--recipe", "flowers-pretrained", "--quiet"]) == 1
    assert capsys.readouterr().err.startswith(
        "error: --recipe flowers-pretrained fine-tunes pretrained weights: give --weights PATH")
    assert main(["train", "--data", "digits", "--weights",
                 str(weights("resnet_bottleneck_tiny")), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "resnet_bottleneck_tiny.safetensors is not a resnet50: tensor 'layer1.0.bn1.bias'" in err
    assert err.count("\n") == 1


def test_bfloat16_files_load_as_float32(tmp_path):
    import jax.numpy as jnp
    from safetensors.flax import save_file
    from safetensors.numpy import load_file

    state = load_file(weights("resnet_bottleneck_tiny"))
    halved = {k: jnp.asarray(v, jnp.bfloat16) if v.dtype == np.float32 else jnp.asarray(v)
              for k, v in state.items()}
    save_file(halved, tmp_path / "bf16.safetensors")
    spec = NETS["resnet_bottleneck_tiny"][0]
    net = jf.models.pretrained(spec, weights=tmp_path / "bf16.safetensors")
    kernel = net.variables["params"]["conv_init"]["kernel"]
    assert kernel.dtype == np.float32
    np.testing.assert_array_equal(kernel, np.asarray(halved["conv1.weight"], np.float32)
                                  .transpose(2, 3, 1, 0))
