"""Checkpoints and resume through the public API: exact continuation after a kill -9, on
another device count, kept newest-first; a kill during a save loses nothing usable; a
checkpoint of another run is refused; Ctrl-C stops at a block boundary and keeps results."""
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import jaxflowers as jf

ROOT = pathlib.Path(__file__).resolve().parents[1]
EPOCH = 6  # iterations per epoch: 100 training images, mini-batch 16


def _data():
    digits = jf.data.digits()
    keep = np.random.default_rng(0).permutation(len(digits))[:130]
    return digits.subset(keep[:100]), digits.subset(keep[100:])


def _options(path=None, **changes):
    train, val = _data()
    opts = jf.TrainingOptions(solver="adam", initial_learn_rate=0.01, mini_batch_size=16,
                              max_epochs=3, shuffle="every-epoch", validation_data=val,
                              validation_frequency=4, verbose=False, seed=5,
                              augmentation=jf.data.Augmentation(reflect_x=True,
                                                                translate_x=(-2, 2)),
                              checkpoint_path=None if path is None else str(path))
    return opts.replace(**changes)


def _model():
    return jf.models.cifar_net(1, num_classes=10)


# A run in its own process that kills itself with SIGKILL in the middle of epoch 3, after
# the checkpoints of epochs 1 and 2 were started.
KILLED = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import test_checkpoint as t
import jaxflowers as jf
jf.enable_compilation_cache()  # $JAXFLOWERS_COMPILE_CACHE: what the tests compiled loads
def output_fn(message):
    if message["state"] == "iteration" and message["iteration"] == 2 * t.EPOCH + 3:
        os.kill(os.getpid(), signal.SIGKILL)
train, _ = t._data()
jf.train(train, t._model(), t._options({path!r}, output_fn=output_fn))
"""


def _run_script(script: str, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _steps(folder) -> list[int]:
    """The iterations of the checkpoints in ``folder`` (``iteration_<N>`` folders)."""
    return sorted(int(p.name.removeprefix("iteration_")) for p in pathlib.Path(folder).iterdir()
                  if p.name.startswith("iteration_") and p.name[10:].isdigit())


def _assert_same(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_each_checkpoint_records_the_history_of_its_own_iteration(tmp_path, monkeypatch):
    """A checkpoint is written in a thread while training goes on: its record must be the
    history up to its iteration, however late the thread writes it."""
    import json

    from jaxflowers.training import checkpoint

    write = checkpoint.Checkpointer._write

    def late_write(self, *args):
        time.sleep(0.5)  # training records several more iterations meanwhile
        write(self, *args)

    monkeypatch.setattr(checkpoint.Checkpointer, "_write", late_write)
    train, _ = _data()
    jf.train(train, _model(), _options(tmp_path))
    assert _steps(tmp_path) == [EPOCH, 2 * EPOCH, 3 * EPOCH]
    for step in _steps(tmp_path):
        record = json.loads((tmp_path / f"iteration_{step}" / "record" / "metadata").read_text())
        history = record["history"]
        assert {len(rows) for rows in history["rows"].values()} == {step}, (step, history)
        assert max(history["validations"]["iteration"]) <= step


def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_result(tmp_path):
    train, _ = _data()
    net_ref, info_ref = jf.train(train, _model(), _options())
    result = _run_script(KILLED.format(tests=str(ROOT / "tests"), path=str(tmp_path)))
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    saved = _steps(tmp_path)
    assert saved and set(saved) <= {EPOCH, 2 * EPOCH}, saved
    net, info = jf.train(train, _model(), _options(), resume=tmp_path)
    # Bit for bit on the CPU: parameters, batch-norm statistics and the whole history.
    _assert_same(net.variables, net_ref.variables)
    for field in ("iteration", "epoch", "loss", "accuracy", "learn_rate", "validation_iteration",
                  "validation_loss", "validation_accuracy"):
        np.testing.assert_array_equal(getattr(info, field), getattr(info_ref, field), field)
    assert info.stop_reason == "max epochs completed" and len(info.loss) == 3 * EPOCH


def test_resume_on_another_device_count_gives_the_same_numbers(tmp_path):
    """Checkpoints hold the state in tree form: 4 devices to an epoch, then 1 device on.
    (SGDM: Adam would turn the rounding noise of the zero gradient of a convolution bias
    that feeds batch norm into +-lr steps; tests/test_parallel.py.)"""
    train, _ = _data()
    sync = jf.ExecutionOptions(sync_batch_norm=True)
    recipe = dict(solver="sgdm", initial_learn_rate=0.05, max_epochs=2)
    net_ref, info_ref = jf.train(train, _model(), _options(**recipe), execution=sync)
    first_epoch = lambda message: message.get("iteration") == EPOCH  # noqa: E731 (stops there)
    jf.train(train, _model(), _options(tmp_path, output_fn=first_epoch, **recipe), execution=sync)
    net, info = jf.train(train, _model(), _options(**recipe), resume=tmp_path,
                         execution=sync.replace(num_devices=1))
    for a, b in zip(jax.tree.leaves(net.variables), jax.tree.leaves(net_ref.variables)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(info.loss, info_ref.loss, rtol=1e-5)
    np.testing.assert_array_equal(info.loss[:EPOCH], info_ref.loss[:EPOCH])  # restored as run


def test_checkpoints_follow_frequency_and_unit_and_keep_the_newest(tmp_path):
    train, _ = _data()
    _, info = jf.train(train, _model(), _options(tmp_path / "e", checkpoint_keep=2))  # 3 epochs
    assert _steps(tmp_path / "e") == [2 * EPOCH, 3 * EPOCH]
    assert info.checkpoint == str(tmp_path / "e" / f"iteration_{3 * EPOCH}")
    jf.train(train, _model(), _options(tmp_path / "i", max_epochs=1, checkpoint_frequency=4,
                                       checkpoint_frequency_unit="iteration"))
    assert _steps(tmp_path / "i") == [4]


# Saves a checkpoint every iteration until killed: a kill -9 lands during a save.
SAVING = """
import sys
sys.path.insert(0, {tests!r})
import test_checkpoint as t
import jaxflowers as jf
jf.enable_compilation_cache()
train, _ = t._data()
print("started", flush=True)
jf.train(train, t._model(), t._options({path!r}, max_epochs=200, checkpoint_frequency=1,
                                       checkpoint_frequency_unit="iteration", validation_data=None))
"""


@pytest.mark.slow
def test_a_kill_during_a_save_leaves_a_usable_checkpoint(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    train, _ = _data()
    delays = (0.3, 0.9)
    processes = [subprocess.Popen([sys.executable, "-c", SAVING.format(
        tests=str(ROOT / "tests"), path=str(tmp_path / str(delay)))], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for delay in delays]
    try:  # side by side: each is killed after its own delay
        for delay, process in zip(delays, processes):
            folder = tmp_path / str(delay)
            assert process.stdout.readline().strip() == "started"
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and len(list(folder.glob("*"))) < 4:
                time.sleep(0.05)  # several checkpoints written, more on their way
            time.sleep(delay)
            process.kill()
            process.wait(30)
    finally:
        for process in processes:
            process.kill()
            process.wait(30)
    for delay in delays:
        folder = tmp_path / str(delay)
        complete = _steps(folder)
        assert complete, list(folder.iterdir())
        net, info = jf.train(train, _model(), _options(
            max_epochs=200, validation_data=None,
            output_fn=lambda m, last=complete[-1]: m.get("iteration", 0) >= 2 + last),
            resume=folder)
        assert info.iteration[-1] > complete[-1]


def test_a_checkpoint_of_another_recipe_or_data_is_refused_naming_both(tmp_path):
    train, _ = _data()
    jf.train(train, _model(), _options(tmp_path, max_epochs=1))
    with pytest.raises(ValueError, match=r"other options: mini_batch_size \(16 there, 20 now\)"):
        jf.train(train, _model(), _options(mini_batch_size=20), resume=tmp_path)
    with pytest.raises(ValueError, match="other data"):
        jf.train(train.subset(np.arange(90)), _model(), _options(), resume=tmp_path)
    with pytest.raises(ValueError, match=r"holds cifar_net\(depth=1, num_classes=10\); this run "
                                         r"builds cifar_net\(depth=2, num_classes=10\)"):
        jf.train(train, jf.models.cifar_net(2, num_classes=10), _options(), resume=tmp_path)
    with pytest.raises(ValueError, match=f"no checkpoint in {tmp_path / 'nothing'}"):
        jf.train(train, _model(), _options(), resume=tmp_path / "nothing")


INTERRUPTED = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import test_checkpoint as t
import jaxflowers as jf
jf.enable_compilation_cache()
def output_fn(message):
    if message["state"] == "iteration" and message["iteration"] == 5:
        os.kill(os.getpid(), signal.{signal})  # Ctrl-C in a terminal, or kill / Slurm
train, _ = t._data()
net, info = jf.train(train, t._model(), t._options({path!r}, output_fn=output_fn))
print("RESULT", info.stop_reason, len(info.loss), info.checkpoint)
"""


@pytest.mark.parametrize("signal_name, reason, said", [
    ("SIGINT", "interrupted", "Ctrl-C: stopping"), ("SIGTERM", "terminated", "SIGTERM: stopping")])
def test_a_stop_signal_ends_at_a_block_boundary_with_results_and_a_checkpoint(
        tmp_path, signal_name, reason, said):
    result = _run_script(INTERRUPTED.format(tests=str(ROOT / "tests"), path=str(tmp_path),
                                            signal=signal_name))
    assert result.returncode == 0, result.stderr[-2000:]
    stopped, iterations, checkpoint = result.stdout.split("RESULT")[1].split()
    assert stopped == reason and int(iterations) in (5, 6), result.stdout
    assert checkpoint == str(tmp_path / f"iteration_{iterations}")
    assert "Traceback" not in result.stderr and said in result.stderr
    train, _ = _data()
    _, info = jf.train(train, _model(), _options(), resume=checkpoint)
    assert len(info.loss) == 3 * EPOCH


def test_a_checkpoint_of_the_one_vector_layout_resumes_in_the_tree_layout(tmp_path):
    """GPUs update the parameters (and batch-norm statistics) as one vector; checkpoints
    hold the model's tree, so a run can continue in either layout."""
    train, _ = _data()
    recipe = dict(solver="sgdm", initial_learn_rate=0.05, max_epochs=2)
    tree, flat = (jf.ExecutionOptions(parameter_layout=layout) for layout in ("tree", "flat"))
    net_ref, info_ref = jf.train(train, _model(), _options(**recipe), execution=tree)
    jf.train(train, _model(), _options(tmp_path, **dict(recipe, max_epochs=1)), execution=flat)
    net, info = jf.train(train, _model(), _options(**recipe), resume=tmp_path, execution=tree)
    assert jax.tree.structure(net.variables) == jax.tree.structure(net_ref.variables)
    for a, b in zip(jax.tree.leaves(net.variables), jax.tree.leaves(net_ref.variables)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(info.loss, info_ref.loss, rtol=1e-5)
