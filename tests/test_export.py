"""Exports: ONNX under onnxruntime and StableHLO in a process without jaxflowers give
``predict``'s scores, for ``cifar_net`` and a torchvision ResNet loaded from its weights
(whose ONNX scores are then torch's softmax); the ``export`` command writes both."""
import base64
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.cli import main

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
TINY = ("resnet", {"stage_sizes": [1, 1, 1, 1], "block": "bottleneck", "num_filters": 8})


@pytest.fixture(scope="module")
def cifar(digits):
    """A cifar_net(1) with random weights and the digits' classes."""
    model = jf.models.cifar_net(1, num_classes=len(digits.class_names))
    variables = jax.tree.map(np.asarray, model.init(jax.random.PRNGKey(3), jnp.zeros(
        (1, 32, 32, 3)), train=False))
    normalization = (np.array([30.0, 31.0, 32.0], np.float32), np.array([40.0, 41.0, 42.0],
                                                                         np.float32))
    return jf.TrainedNet(model, variables, tuple(digits.class_names), normalization, (32, 32, 3))


@pytest.fixture(scope="module")
def resnet():
    """(the torchvision fixture as a TrainedNet with its own head, its images, torch's
    softmax scores)."""
    ref = json.loads((FIXTURES / "resnet_bottleneck_tiny.json").read_text())
    images = np.frombuffer(base64.b64decode(ref["images"]), np.uint8).reshape(ref["shape"])
    loaded = jf.models.pretrained(TINY, weights=FIXTURES / "resnet_bottleneck_tiny.safetensors")
    with pytest.raises(TypeError, match="predict takes a TrainedNet, not a Pretrained"):
        jf.predict(loaded, images)
    net = jf.TrainedNet.from_pretrained(loaded, tuple("abcde"), images.shape[1:])
    np.testing.assert_allclose(jf.predict(net, images), _softmax(ref["logits"]), atol=1e-6)
    return net, images, _softmax(ref["logits"])


def _softmax(logits):
    logits = np.asarray(logits)
    scores = np.exp(logits - logits.max(1, keepdims=True))
    return scores / scores.sum(1, keepdims=True)


def _images(digits, n):
    return digits.images[np.random.default_rng(n).permutation(len(digits))[:n]]


def test_onnx_scores_equal_predict_for_cifar_net_and_torch_s_for_the_resnet(cifar, resnet,
                                                                            digits, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("jax2onnx")
    cases = [(cifar, _images(digits, 5), None), (*resnet[:2], resnet[2])]
    for net, images, torch_scores in cases:
        session = ort.InferenceSession(str(net.export_onnx(tmp_path / "net.onnx")))
        (given,), (taken,) = session.get_inputs(), session.get_outputs()
        assert (given.name, given.type, given.shape[1:]) == ("images", "tensor(uint8)",
                                                             list(images.shape[1:]))
        assert taken.name == "scores" and isinstance(given.shape[0], str)  # any batch
        for batch in (images, images[:1]):
            scores = session.run(None, {"images": batch})[0]
            np.testing.assert_allclose(scores, jf.predict(net, batch), atol=1e-4, rtol=0)
        if torch_scores is not None:
            np.testing.assert_allclose(scores, torch_scores[:1], atol=1e-4, rtol=0)


_RUN_EXPORTED = """
import json, sys
import jax, numpy as np
exported = jax.export.deserialize(open(sys.argv[1], "rb").read())
images = np.load(sys.argv[2])
out = [np.asarray(exported.call(images[:n])).tolist() for n in (len(images), 1)]
assert not [m for m in sys.modules if m.startswith("jaxflowers")]
print(json.dumps(out))
"""


@pytest.mark.parametrize("which", ["cifar", "resnet"])
def test_stablehlo_runs_in_a_process_that_never_imports_jaxflowers(which, cifar, resnet,
                                                                   digits, tmp_path):
    net, images = (cifar, _images(digits, 6)) if which == "cifar" else resnet[:2]
    path = net.export(tmp_path / "net.stablehlo")
    np.save(tmp_path / "images.npy", images)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", _RUN_EXPORTED, str(path),
                           str(tmp_path / "images.npy")], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    every, one = (np.asarray(s) for s in json.loads(done.stdout))
    np.testing.assert_allclose(every, jf.predict(net, images), atol=1e-5, rtol=0)
    np.testing.assert_allclose(one, every[:1], atol=1e-6, rtol=0)


def test_export_command_writes_both_formats_and_fails_in_one_line(cifar, tmp_path, capsys):
    saved = cifar.save(tmp_path / "net.safetensors")
    assert main(["export", str(saved), str(tmp_path / "net.stablehlo")]) == 0
    assert "exported as stablehlo" in capsys.readouterr().out
    assert jax.export.deserialize((tmp_path / "net.stablehlo").read_bytes()).out_avals[0].shape[
        1:] == (len(cifar.class_names),)
    if importlib.util.find_spec("jax2onnx") and importlib.util.find_spec("onnxruntime"):
        import onnxruntime

        assert main(["export", str(saved), str(tmp_path / "model.bin"), "--format", "onnx"]) == 0
        session = onnxruntime.InferenceSession(str(tmp_path / "model.bin"))
        assert [i.name for i in session.get_inputs()] == ["images"]
    capsys.readouterr()
    assert main(["export", str(saved), str(tmp_path / "net.xyz")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot tell the format of") and err.count("\n") == 1
    assert main(["export", str(tmp_path / "absent.safetensors"), "out.onnx"]) == 1
    assert capsys.readouterr().err == (f"error: no saved network at "
                                       f"{tmp_path / 'absent.safetensors'}\n")
