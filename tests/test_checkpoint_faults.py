"""Checkpoints at the edges of a run: a disk that fills or turns read-only, two runs in one
folder, folders that are not ours, a flipped bit, changed images. Each ends with a clear
message naming the folder, nothing lost, nothing half-written left behind."""
import contextlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from test_checkpoint import EPOCH, _data, _model, _options, _steps

import jaxflowers as jf

ROOT = pathlib.Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def _small_disk(path: pathlib.Path, size: str):
    """A tmpfs of ``size`` at ``path`` (root only; skipped with the reason elsewhere)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a small disk needs root to mount a tmpfs")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _cli(args, cwd, timeout=300, **env):
    return subprocess.run([sys.executable, "-m", "jaxflowers", "train", *args], cwd=cwd,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **env),
                          capture_output=True, text=True, timeout=timeout)


_RUN = ["--depth", "1", "--epochs", "2", "--batch-size", "64", "--quiet",
        "--checkpoint-frequency", "5", "--checkpoint-frequency-unit", "iteration"]


@pytest.mark.parametrize("size", ["100k", "1m"])
def test_a_full_disk_is_one_warning_and_every_result_is_kept(tmp_path, size):
    with _small_disk(tmp_path / "disk", size) as disk:
        start = time.monotonic()
        result = _cli([*_RUN, "--checkpoint-dir", str(disk / "ck"), "--out", str(tmp_path),
                       "--save", str(tmp_path / "net.safetensors")], tmp_path)
        took = time.monotonic() - start
        leftovers = [p.name for p in (disk / "ck").iterdir()]
    assert result.returncode == 0, result.stderr[-3000:]
    warned = [line for line in result.stderr.splitlines() if line.strip()]
    assert warned and all(line.startswith("warning: ") for line in warned), warned
    assert re.match(rf"warning: could not write the checkpoint of iteration \d+ into "
                    rf"{re.escape(str(disk / 'ck'))}: No space left on device", warned[0])
    assert "Traceback" not in result.stderr and "orbax" not in result.stderr
    assert "Test accuracy" in result.stdout and jf.load(tmp_path / "net.safetensors")
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 1 + 2 * (1617 // 64)
    assert not [name for name in leftovers if "tmp" in name], leftovers
    assert took < 120


def test_checkpoint_failure_stop_ends_the_run_and_keeps_its_results(tmp_path):
    with _small_disk(tmp_path / "disk", "100k") as disk:
        result = _cli([*_RUN, "--checkpoint-dir", str(disk / "ck"), "--out", str(tmp_path),
                       "--checkpoint-failure", "stop",
                       "--save", str(tmp_path / "net.safetensors")], tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last == (f"error: training stopped: a checkpoint could not be written at iteration "
                    f"5 (--checkpoint-failure stop); kept {tmp_path / 'metrics.csv'}, "
                    f"{tmp_path / 'net.safetensors'}, {tmp_path / 'training_progress.png'}"), \
        result.stderr
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 1 + 5
    assert "Traceback" not in result.stderr


def test_a_folder_turned_read_only_mid_run_is_a_warning_and_training_goes_on(tmp_path):
    """Checkpoints every iteration; the file system is remounted read-only under the run
    (as when a network mount fails). The run finishes, says so once, and its last good
    checkpoint is the one it names."""
    with _small_disk(tmp_path / "disk", "64m") as disk:
        script = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
                  "import subprocess, time, test_checkpoint as t, jaxflowers as jf\n"
                  "jf.enable_compilation_cache()\n"
                  "def output_fn(message):\n"
                  "    if message.get('iteration') == 8 and message['state'] == 'iteration':\n"
                  "        for _ in range(200):  # busy while a save in flight holds a file\n"
                  f"            if not subprocess.run(['mount', '-o', 'remount,ro', "
                  f"{str(disk)!r}], capture_output=True).returncode:\n"
                  "                return\n"
                  "            time.sleep(0.05)\n"
                  "        raise RuntimeError('the disk stayed busy')\n"
                  "train, _ = t._data()\n"
                  "net, info = jf.train(train, t._model(), t._options("
                  f"{str(disk / 'ck')!r}, checkpoint_frequency=1, "
                  "checkpoint_frequency_unit='iteration', output_fn=output_fn))\n"
                  "print('RESULT', info.stop_reason, len(info.loss), info.checkpoint)\n")
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
        steps = _steps(disk / "ck")
    assert result.returncode == 0, result.stderr[-3000:]
    stopped, iterations, checkpoint = result.stdout.split("RESULT ")[1].strip().rsplit(" ", 2)
    assert stopped == "max epochs completed" and int(iterations) == 3 * EPOCH
    assert re.search(r"could not write the checkpoint of iteration \d+ into .*: Read-only file "
                     r"system; training goes on without it", result.stderr), result.stderr
    assert "Traceback" not in result.stderr
    assert checkpoint == str(disk / "ck" / f"iteration_{steps[-1]}") and steps[-1] <= 9


def test_a_fresh_run_refuses_a_folder_holding_another_runs_checkpoints(tmp_path):
    train, _ = _data()
    jf.train(train, _model(), _options(tmp_path, max_epochs=1))
    with pytest.raises(ValueError, match=rf"checkpoint_path {re.escape(str(tmp_path))} already "
                                         rf"holds the checkpoints of another run \(iterations "
                                         rf"{EPOCH}-{EPOCH}\); continue it with resume="):
        jf.train(train, _model(), _options(tmp_path, max_epochs=2, seed=1))
    assert _steps(tmp_path) == [EPOCH]  # nothing replaced
    _, info = jf.train(train, _model(), _options(tmp_path, max_epochs=2), resume=tmp_path)
    assert _steps(tmp_path) == [EPOCH, 2 * EPOCH] and len(info.loss) == 2 * EPOCH


def test_two_live_runs_cannot_share_a_folder_and_a_dead_ones_lock_is_gone(tmp_path):
    script = (f"import sys, time; sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
              "import test_checkpoint as t, jaxflowers as jf\n"
              "jf.enable_compilation_cache()\n"
              "train, _ = t._data()\n"
              "jf.train(train, t._model(), t._options("
              f"{str(tmp_path)!r}, max_epochs=50, validation_data=None, "
              "output_fn=lambda m: time.sleep(0.2)))\n")
    holder = subprocess.Popen([sys.executable, "-c", script],
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        deadline = time.monotonic() + 120
        while not _steps(tmp_path) and time.monotonic() < deadline:  # a checkpoint is written
            time.sleep(0.1)
        train, _ = _data()
        with pytest.raises(ValueError, match=rf"checkpoint_path {re.escape(str(tmp_path))} is in "
                                             rf"use by another run \(pid {holder.pid} on "):
            jf.train(train, _model(), _options(tmp_path, max_epochs=1))
    finally:
        holder.kill()
        holder.wait(30)
    _, info = jf.train(train, _model(), _options(max_epochs=50, validation_data=None,
                                                 output_fn=lambda m: m.get("iteration", 0) > 1),
                       resume=tmp_path)  # SIGKILL left the lock file, not the lock
    assert info.stopped_by is jf.StopReason.OUTPUT_FN


def test_folders_that_are_not_checkpoints_are_left_alone(tmp_path):
    for name in ("1", "2", "3", "4", "5", "2023"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text(name)
    train, _ = _data()
    _, info = jf.train(train, _model(), _options(tmp_path, max_epochs=2))
    assert _steps(tmp_path) == [EPOCH, 2 * EPOCH]
    assert info.checkpoint == str(tmp_path / f"iteration_{2 * EPOCH}")
    assert all((tmp_path / n / "notes.txt").read_text() == n for n in ("1", "2023"))


def _flip_a_bit_of_the_state(checkpoint: pathlib.Path) -> None:
    """One bit of the largest data chunk of the state (orbax's OCDBT store)."""
    chunk = max((p for p in (checkpoint / "state").rglob("*") if p.is_file()
                 and "/d/" in str(p)), key=lambda p: p.stat().st_size)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))


def test_a_flipped_bit_is_caught_and_the_checkpoint_before_it_used(tmp_path):
    train, _ = _data()
    jf.train(train, _model(), _options(tmp_path, max_epochs=2))
    newest = tmp_path / f"iteration_{2 * EPOCH}"
    _flip_a_bit_of_the_state(newest)
    with pytest.raises(ValueError, match=rf"the checkpoint {re.escape(str(newest))} is damaged: "
                                         r"its array .* does not match the digest"):
        jf.train(train, _model(), _options(max_epochs=3), resume=newest)
    with pytest.warns(RuntimeWarning, match=rf"{re.escape(str(newest))} is damaged.*resuming "
                                            r"from the checkpoint before it instead"):
        _, info = jf.train(train, _model(), _options(max_epochs=3), resume=tmp_path)
    reference = jf.train(train, _model(), _options(max_epochs=3))[1]
    np.testing.assert_array_equal(info.loss, reference.loss)  # continued from EPOCH, exactly


def test_images_changed_since_the_checkpoint_are_noticed_on_resume(tmp_path):
    train, _ = _data()
    jf.train(train, _model(), _options(tmp_path, max_epochs=1))
    images = np.array(train.images)
    images[7, 3, 3, 0] ^= 1  # the same count, classes and shapes: one pixel differs
    changed = jf.data.ImageSet(images, train.labels, train.class_names)
    with pytest.raises(ValueError, match="trained on other images: the training set has as many "
                                         "images of the same classes, but their contents changed"):
        jf.train(changed, _model(), _options(max_epochs=2), resume=tmp_path)


def test_a_checkpoint_of_format_3_is_checked_by_its_digest_of_the_images_bytes(tmp_path):
    """Format 3 recorded the xxh3 of the images' bytes as the data's digest: such a checkpoint
    is checked by that digest (the same images resume, changed ones are refused); a format
    this version does not know is refused naming the formats it reads."""
    import json

    from jaxflowers.data import digests

    train, _ = _data()
    jf.train(train, _model(), _options(tmp_path, max_epochs=1))
    (step,) = _steps(tmp_path)
    path = tmp_path / f"iteration_{step}" / "record" / "metadata"
    record = json.loads(path.read_text())
    assert record["data"]["digest"] == digests.set_digest(train)
    assert record["data"]["digest"].startswith(digests.PREFIX)
    record["format"], record["data"]["digest"] = 3, digests.bytes_digest(train)
    path.write_text(json.dumps(record))
    images = np.array(train.images)
    images[7, 3, 3, 0] ^= 1
    changed = jf.data.ImageSet(images, train.labels, train.class_names)
    with pytest.raises(ValueError, match="trained on other images"):
        jf.train(changed, _model(), _options(max_epochs=2), resume=tmp_path)
    seen = []
    _, info = jf.train(train, _model(), _options(
        max_epochs=2, output_fn=lambda m: seen.append(m.get("iteration")) and False),
        resume=tmp_path)
    assert min(i for i in seen if i) == step + 1, "continued from the checkpoint"
    reference = jf.train(train, _model(), _options(max_epochs=2))[1]
    np.testing.assert_array_equal(info.loss, reference.loss)
    path.write_text(json.dumps({**record, "format": 5}))
    with pytest.raises(ValueError, match="has checkpoint format 5; this version reads formats "
                                         "3, 4"):
        jf.train(train, _model(), _options(max_epochs=2), resume=path.parents[1])


def test_auc_of_a_diverging_run_is_a_divergence_not_an_error():
    train, val = _data()
    opts = _options(solver="sgdm", initial_learn_rate=1e6, metrics=("auc",),
                    validation_frequency=2, objective_metric_name="auc")
    _, info = jf.train(train, _model(), opts)
    assert info.diverged and np.isnan(info.validation_metrics["auc"]).all()
