"""Prediction: exact over ragged sample counts on 4 devices; accuracy and confusion by hand."""
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_saving import tiny_net

import jaxflowers as jf

ROOT = pathlib.Path(__file__).resolve().parents[1]

class _Linear:
    """A stand-in network whose logits are known: the mean of each channel, scaled."""

    dtype = jnp.float32

    def apply(self, variables, x, train=False):
        return jnp.mean(x, axis=(1, 2)) * variables["params"]["scale"]


def _net(num_classes=3, shape=(4, 4, 3)):
    names = tuple(f"c{i}" for i in range(num_classes))
    return jf.TrainedNet(model=_Linear(), variables={"params": {"scale": np.float32(2.0)}},
                         class_names=names,
                         normalization=(np.zeros(3, np.float32), np.ones(3, np.float32)),
                         input_shape=shape)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 13, 17])
@pytest.mark.parametrize("strategy", ["shard_map", "pmap"])
def test_predict_counts_every_sample_once(n, strategy):
    images = np.random.default_rng(n).integers(0, 256, (n, 4, 4, 3), dtype=np.uint8)
    scores = jf.predict(_net(), images, mini_batch_size=2, strategy=strategy)
    logits = images.astype(np.float64).mean(axis=(1, 2)) * 2.0
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    assert scores.shape == (n, 3)
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


def test_predict_uses_every_device_and_rejects_bad_input():
    assert len(jax.devices()) == 4
    with pytest.raises(ValueError, match="uint8 images"):
        jf.predict(_net(), np.zeros((2, 4, 4, 3), np.float32))
    with pytest.raises(ValueError, match=r"trained on \(4, 4, 3\)"):
        jf.predict(_net(), np.zeros((2, 5, 5, 3), np.uint8))


def test_scores_to_labels_and_classify():
    labels = jf.scores_to_labels(np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]]), ("a", "b", "c"))
    assert labels.tolist() == ["b", "a"]
    np.testing.assert_array_equal(labels.codes, [1, 0])
    images = np.zeros((3, 4, 4, 3), np.uint8)
    images[0, ..., 2] = 200
    images[1, ..., 0] = 9
    images[2, ..., 1] = 50
    labels, scores = jf.classify(_net(), images)
    assert labels.tolist() == ["c2", "c0", "c1"] and scores.shape == (3, 3)
    with pytest.raises(ValueError, match="do not match 2 class names"):
        jf.scores_to_labels(np.ones((2, 3)), ("a", "b"))


def test_accuracy_and_confusion_matrix_worked_by_hand():
    names = ("cat", "dog", "fox")
    true = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 1])
    pred = np.array([0, 1, 0, 1, 1, 2, 0, 2, 1, 1])
    # correct: 0,2,3,4,5,7,9 -> 7 of 10
    assert jf.accuracy(pred, true) == pytest.approx(0.7)
    expected = np.array([[2, 1, 0],
                         [0, 3, 0],
                         [1, 1, 2]])
    np.testing.assert_array_equal(jf.confusion_matrix(true, pred, num_classes=3), expected)
    named = jf.scores_to_labels(np.eye(3)[pred], names)  # names vs integer labels, mixed
    assert jf.accuracy(named, true) == pytest.approx(0.7)
    np.testing.assert_array_equal(jf.confusion_matrix(true, named), expected)
    with pytest.raises(ValueError, match="not among the class names"):
        jf.accuracy(np.array(["wolf"]), np.array([0]), names)
    with pytest.raises(ValueError, match="one shape"):
        jf.accuracy(pred[:3], true)


REUSE = """
import jax, numpy as np
import jaxflowers as jf
data = jf.data.digits()
train, val = data.subset(np.arange(96)), data.subset(np.arange(96, 133))
opts = jf.TrainingOptions(mini_batch_size=16, max_epochs=1, verbose=False, validation_data=val)
events = []  # what JAX did to get a program: trace, lower, compile (or load)
jax.monitoring.register_event_duration_secs_listener(
    lambda name, _, **kw: events.append(name) if "/compile/" in name else None)
for layout in ("flat", "tree"):
    execution = jf.ExecutionOptions(num_devices=2, parameter_layout=layout)
    net, info = jf.train(train, jf.models.cifar_net(1), opts, execution=execution)
    for batch in (8, 4):  # training's validation batch, then another
        del events[:]
        scores = jf.predict(net, val, mini_batch_size=batch, num_devices=2)
        accuracy = 100 * np.mean(np.argmax(scores, 1) == val.labels)  # percent, as MATLAB's
        print(layout, batch, len(events), abs(accuracy - info.final_validation_accuracy) < 1e-9)
"""


def test_predict_after_train_reuses_the_compiled_validation_pass():
    """Same devices, batch and images as training's validation: the pass is training's,
    already compiled: nothing is traced, lowered or compiled. Another batch is another
    program, compiled once in the process: the update's parameter layout never reaches
    the forward pass, so the second training's passes are all reused."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", REUSE], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[0] in
            ("flat", "tree")]
    assert [(r[0], r[1]) for r in rows] == [("flat", "8"), ("flat", "4"), ("tree", "8"),
                                            ("tree", "4")], rows
    assert [int(r[2]) for r in rows][::2] == [0, 0], rows  # the validation pass itself
    assert int(rows[1][2]) >= 3 and int(rows[3][2]) == 0, rows  # compiled once, then reused
    assert all(r[3] == "True" for r in rows), rows  # the final validation's accuracy


def test_predict_on_no_images_gives_an_empty_score_table():
    net = tiny_net()
    scores = jf.predict(net, np.zeros((0, 32, 32, 3), np.uint8))
    assert scores.shape == (0, 2) and scores.dtype == np.float32
    labels, scores = jf.classify(net, np.zeros((0, 32, 32, 3), np.uint8))
    assert labels.shape == (0,) and scores.shape == (0, 2)


@pytest.mark.parametrize("images, message", [
    (np.zeros((2, 32, 32, 3), np.float32), r"predict needs uint8 images \(n, H, W, C\); got "
                                           "float32"),
    (np.zeros((2, 28, 32, 3), np.uint8), r"images are \(28, 32, 3\) but the network was "
                                         r"trained on \(32, 32, 3\)"),
])
def test_predict_refuses_images_the_network_cannot_take(images, message):
    with pytest.raises(ValueError, match=message):
        jf.predict(tiny_net(), images)
