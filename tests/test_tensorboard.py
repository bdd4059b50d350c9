"""tensorboard_log: the event file holds every iteration's scalars, written once each."""
import struct
import sys

import numpy as np
import pytest

from jaxflowers import TrainingInfo
from jaxflowers.training.tensorboard import TensorBoardLog


def make_info(n):
    it = np.arange(1, n + 1)
    val = np.arange(4, n + 1, 4)
    return TrainingInfo(iteration=it, epoch=(it - 1) // 4 + 1, loss=2.0 / it,
                        accuracy=np.linspace(10.0, 95.0, 12)[:n], learn_rate=np.full(n, 0.5),
                        validation_iteration=val, validation_loss=1.0 / val,
                        validation_accuracy=50.0 + val)


def read_scalars(log_dir) -> dict:
    """{tag: [(step, value), ...]} from the event files (TFRecord framing: length, its CRC,
    the serialised Event, its CRC)."""
    from tensorboardX.proto import event_pb2

    scalars = {}
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_scalars_by_iteration_each_written_once(tmp_path):
    log = TensorBoardLog(tmp_path / "run")
    log.update(make_info(5))
    log.update(make_info(5))  # nothing new: nothing written twice
    log.close(make_info(12))
    scalars = read_scalars(tmp_path / "run")
    assert sorted(scalars) == ["training/accuracy", "training/learn_rate", "training/loss",
                               "validation/accuracy", "validation/loss"]
    loss = scalars["training/loss"]
    assert [step for step, _ in loss] == list(range(1, 13))
    np.testing.assert_allclose([v for _, v in loss], 2.0 / np.arange(1, 13), rtol=1e-6)
    assert scalars["validation/accuracy"] == [(4, 54.0), (8, 58.0), (12, 62.0)]
    assert {v for _, v in scalars["training/learn_rate"]} == {0.5}


def test_without_tensorboardx_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ImportError, match=r"log_dir='.*runs'\) needs tensorboardX: pip install "
                                          r"\"jaxflowers\[tensorboard\]\""):
        TensorBoardLog(tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_train_asks_for_tensorboardx_before_it_compiles(tmp_path, monkeypatch, digits):
    import jaxflowers as jf
    from jaxflowers.training import program

    def never(*args, **kwargs):
        raise AssertionError("compiled before the missing package was reported")

    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    monkeypatch.setattr(program.TrainProgram, "__init__", never)
    opts = jf.TrainingOptions(max_epochs=1, log_dir=tmp_path / "tb")
    with pytest.raises(ImportError, match="needs tensorboardX"):
        jf.train(digits, jf.models.cifar_net(1), opts)
