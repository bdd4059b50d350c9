"""Streaming from the host: the plan it reads, its equality with resident training, the choice."""
import contextlib
import io
import threading
import time

import jax
import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.data.feed import BUDGET_ENV, choose_placement, device_memory_budget
from jaxflowers.data.stream import StreamedData, process_columns


def _numbered(n=30):
    # Each image holds its own index (low byte, high byte), so a batch shows what was read.
    index = np.arange(n)
    images = np.zeros((n, 4, 4, 3), np.uint8)
    images[..., 0], images[..., 1] = (index % 256)[:, None, None], (index // 256)[:, None, None]
    return jf.data.ImageSet(images, index % 3, ("a", "b", "c"))


def test_an_epoch_reads_every_kept_sample_exactly_once():
    data = _numbered(30)  # batch 8: 3 whole batches per epoch, 6 samples dropped
    feed = StreamedData(data, mini_batch_size=8, num_epochs=2, shuffle="every-epoch", seed=5)
    batches = list(feed.batches)
    assert feed.steps_per_epoch == 3 and len(batches) == 6
    epochs = []
    for epoch in (batches[:3], batches[3:]):
        index = np.concatenate([b["index"] for b in epoch])
        assert len(index) == 24 and len(np.unique(index)) == 24  # each kept one once
        for b in epoch:  # and the batch holds those samples' images and labels
            read = b["images"][:, 0, 0, :2].astype(int) @ [1, 256]
            np.testing.assert_array_equal(read, b["index"])
            np.testing.assert_array_equal(b["labels"], b["index"] % 3)
        epochs.append(index)
    assert not np.array_equal(epochs[0], epochs[1])  # "every-epoch" reshuffles


def test_processes_read_their_own_columns():
    order = np.arange(24).reshape(3, 8)
    np.testing.assert_array_equal(process_columns(order, 1, 2), order[:, 4:])
    with pytest.raises(ValueError, match="mini_batch_size=8 is not divisible by 3 processes"):
        process_columns(order, 0, 3)


def _train(data, placement, num_classes=10):
    opts = jf.TrainingOptions(
        solver="adam", initial_learn_rate=0.01, mini_batch_size=8, max_epochs=2,
        shuffle="every-epoch", seed=7, verbose=True, verbose_frequency=100,
        augmentation=jf.data.Augmentation(reflect_x=True, translate_x=(-3, 3),
                                           translate_y=(-3, 3)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        net, info = jf.train(data, jf.models.cifar_net(1, num_classes=num_classes), opts,
                             execution=jf.ExecutionOptions(data_placement=placement))
    return net, info, out.getvalue()


def _assert_close(tree_a, tree_b, rtol=1e-5):
    """Leaf-wise ||a - b|| <= rtol ||b||."""
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(tree_a), jax.tree.leaves(tree_b)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.linalg.norm(a - b) <= rtol * np.linalg.norm(b), jax.tree_util.keystr(path)


def test_streamed_training_equals_resident_training(digits):
    data = digits.subset(np.arange(50))  # batch 8: 6 iterations per epoch, 2 dropped
    net_r, info_r, out_r = _train(data, "auto")  # a small set: auto keeps it resident
    net_s, info_s, out_s = _train(data, "stream")
    assert "images copied to every device" in out_r and "images streamed from the host" in out_s
    assert (info_r.data_placement, info_s.data_placement) == ("resident", "stream")
    assert len(info_s.loss) == 12
    _assert_close(net_s.variables["params"], net_r.variables["params"])
    _assert_close(net_s.variables["batch_stats"], net_r.variables["batch_stats"])
    np.testing.assert_allclose(info_s.loss, info_r.loss, rtol=1e-5)
    np.testing.assert_allclose(info_s.accuracy, info_r.accuracy)
    assert not np.allclose(info_s.loss[0], info_s.loss[-1])  # it really trained


def test_auto_streams_only_what_exceeds_the_budget(monkeypatch):
    data, devices = _numbered(30), jax.devices()
    nbytes = data.images.nbytes + 4 * len(data)
    monkeypatch.delenv(BUDGET_ENV, raising=False)
    # CPU devices report no memory limit: 8 GiB of host memory split among them.
    assert device_memory_budget(devices) == 8 * 2**30 // len(devices)
    assert choose_placement("auto", data, devices).kind == "resident"
    monkeypatch.setenv(BUDGET_ENV, str(nbytes))
    assert choose_placement("auto", data, devices).kind == "resident"
    monkeypatch.setenv(BUDGET_ENV, str(nbytes - 1))
    assert choose_placement("auto", data, devices) == ("stream", nbytes, nbytes - 1)
    assert choose_placement("resident", data, devices).kind == "resident"  # asked for, kept



def test_a_streamed_folder_is_read_batch_by_batch_never_loaded_whole(tmp_path, monkeypatch):
    """Streaming an ``ImageFolder`` (here the training part of a split) reads its rows from the
    resize cache on disk, so a set larger than memory trains; statistics and training equal
    the resident run's."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, name in enumerate("abc"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 256, (10, 12, 3), dtype=np.uint8) // (c + 1)
            Image.fromarray(pixels).save(tmp_path / "photos" / name / f"{i}.png")
    folder = jf.data.ImageFolder(tmp_path / "photos", image_size=(32, 32),
                                 cache_dir=tmp_path / "cache")
    train, _ = folder.split_each_label(0.75, seed=1)
    resident_net, resident, _ = _train(train.load(), "resident", 3)
    whole = []
    monkeypatch.setattr(jf.data.ImageFolder, "images",
                        property(lambda self: whole.append(len(self)) or 1 / 0))
    streamed_net, streamed, _ = _train(train, "stream", 3)
    assert not whole, "the streamed set was loaded whole"
    assert streamed.data_placement == "stream"
    for a, b in zip(streamed_net.normalization, resident_net.normalization):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(streamed.loss, resident.loss, rtol=1e-5)


def test_close_waits_for_the_batch_each_reader_is_reading(digits, monkeypatch):
    """Closed while grain's threads are halfway through reads (a cold memory map), the feed
    returns only once they have ended: none is left reading into a run that is over."""
    from jaxflowers.data import stream

    read_rows, started, release = stream.read_rows, threading.Event(), threading.Event()
    calls = []

    def slow_after_the_first(data, index):
        calls.append(len(index))
        if len(calls) > 1:
            started.set()
            release.wait(10)
            time.sleep(0.3)  # still reading when close is called
        return read_rows(data, index)

    monkeypatch.setattr(stream, "read_rows", slow_after_the_first)
    feed = StreamedData(digits.subset(np.arange(64)), mini_batch_size=8, num_epochs=2,
                        shuffle="every-epoch", seed=0)
    batches = feed.start()
    assert next(batches)["images"].shape == (8, 32, 32, 3)
    assert started.wait(10), "no reader began a second batch"
    release.set()
    feed.close()
    threads = [t.name for t in threading.enumerate() if t.name.startswith("grain")]
    assert not threads, f"the closed feed left its readers running: {threads}"


def test_a_streamed_run_stopped_early_leaves_no_thread_and_resumes_to_the_whole_run(digits,
                                                                                    tmp_path):
    """grain reads the batches ahead in threads: a run that stops early ends them, and a
    run resumed from its checkpoint reads the rest of the same plan."""
    data = digits.subset(np.arange(50))  # batch 8: 6 iterations per epoch, 24 in all
    opts = jf.TrainingOptions(solver="adam", initial_learn_rate=0.01, mini_batch_size=8,
                              max_epochs=4, seed=3, verbose=False,
                              checkpoint_frequency=2, checkpoint_frequency_unit="iteration")
    stream = jf.ExecutionOptions(data_placement="stream")
    model = jf.models.cifar_net(1, num_classes=10)
    whole_net, whole = jf.train(data, model, opts, execution=stream)
    stop_at_5 = lambda m: m["state"] == "iteration" and m["iteration"] == 5
    _, stopped = jf.train(data, model, opts.replace(output_fn=stop_at_5,
                                                    checkpoint_path=str(tmp_path)),
                          execution=stream)
    assert stopped.stopped_early and len(stopped.loss) < 12  # far from the plan's end
    threads = [t.name for t in threading.enumerate() if t.name.startswith("grain")]
    assert not threads, f"the stopped run left its readers running: {threads}"
    net, resumed = jf.train(data, model, opts.replace(checkpoint_path=str(tmp_path)),
                            execution=stream, resume=tmp_path)
    np.testing.assert_allclose(resumed.loss, whole.loss, rtol=1e-5)  # iterations 1-24
    _assert_close(net.variables["params"], whole_net.variables["params"])
