"""End to end: the README's main job, as a newcomer runs it, on the embedded digits."""
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from image_folders import class_folders as _class_folders
from PIL import Image
from test_saving import tiny_net

import jaxflowers as jf

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_main_job_trains_on_embedded_digits_to_95_percent(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg",
               XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=str(ROOT), JAXFLOWERS_COMPILE_CACHE=str(tmp_path / "xla"))
    result = subprocess.run([sys.executable, "-m", "jaxflowers", "train"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "Training on 4 cpu devices" in out  # every local device
    assert "mini-batch 128 (32 per device on 4 devices)" in out  # and how it was chosen
    assert re.search(r"^ +15 +180 ", out, re.M)  # the table reached epoch 15, iteration 180
    accuracy = float(re.search(r"Test accuracy: ([\d.]+)% \(\d+ images\)", out).group(1))
    assert accuracy >= 95.0, out[-2000:]
    # Where the process's time went, each part once.
    parts = re.search(r"Seconds: JAX start-up ([\d.]+), data ([\d.]+), set-up ([\d.]+), "
                      r"training ([\d.]+), finishing ([\d.]+), prediction ([\d.]+)", out)
    assert parts and float(parts[3]) > 0 and float(parts[4]) > 0, out[-2000:]
    setup = re.search(r"Set-up seconds, overlapping: compile ([\d.]+), placing ([\d.]+)", out)
    assert setup and 0 < float(setup[1]) <= float(parts[3]) and float(setup[2]) <= float(parts[3])
    assert any((tmp_path / "xla").iterdir())  # compiled programs kept for the next run
    # What the example shows, kept in one new run folder; nothing else in the working folder.
    folder = tmp_path / re.search(r"^Run folder: (runs/\S+)$", out, re.M).group(1)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", folder.name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "xla"]
    assert sorted(p.name for p in folder.iterdir()) == ["confusion_chart.png", "metrics.csv",
                                                        "training_progress.png"]
    assert out.splitlines()[-1] == "Saved " + ", ".join(
        str(folder.relative_to(tmp_path) / name) for name in ("metrics.csv",
                                                             "training_progress.png",
                                                             "confusion_chart.png"))
    for name, size in (("training_progress.png", (1100, 600)), ("confusion_chart.png", None)):
        with Image.open(folder / name) as png:
            assert size is None or png.size == size
    assert len((folder / "metrics.csv").read_text().splitlines()) == 1 + 180


def test_cli_rejects_unknown_model():
    result = subprocess.run([sys.executable, "-m", "jaxflowers", "train", "--model", "vgg"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "invalid choice: 'vgg'" in result.stderr


def test_readme_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for marker in ("SETUP", "TEST"):
        command = re.search(rf"^{marker}='(.+)'$", ci, re.M).group(1)
        assert f"\n{command}\n" in readme, f"README lacks the {marker} command {command!r}"


def _blocked(tmp_path) -> pathlib.Path:
    """A file: folders "inside" it cannot be created, even by root."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    return blocker


def _cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``python -m jaxflowers *argv``, run in this process."""
    from jaxflowers.cli.entry import main

    try:
        status = main(list(argv))
    except SystemExit as exit_:  # argparse
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "argument --epochs: '0' is not a positive integer"),
    (["--batch-size", "0"], "argument --batch-size: '0' is not a positive integer"),
    (["--devices", "0"], "argument --devices: '0' is not a positive integer"),
    (["--depth", "0"], "argument --depth: '0' is not a positive integer"),
    (["--epochs", "two"], "argument --epochs: 'two' is not a positive integer"),
    (["--learn-rate", "0"], "argument --learn-rate: '0' is not a positive number"),
    (["--learn-rate", "inf"], "argument --learn-rate: 'inf' is not a positive number"),
    (["--seed", "-1"], "argument --seed: '-1' is not an integer >= 0"),
    (["--num-processes", "0"], "argument --num-processes: '0' is not a positive integer"),
    (["--process-id", "-2"], "argument --process-id: '-2' is not an integer >= 0"),
    (["--model", "vgg"], "argument --model: invalid choice: 'vgg'"),
    (["--resume"], "--resume needs --checkpoint-dir DIR"),
])
def test_the_parser_refuses_bad_arguments_naming_them(capsys, argv, message):
    status, _, err = _cli(capsys, "train", *argv)
    assert status == 2 and message in err.splitlines()[-1]


def test_every_option_has_help_with_its_default():
    import argparse

    from jaxflowers.bench.scaling import _parser as bench_parser
    from jaxflowers.cli.entry import _parser

    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    parsers = {name: commands.choices[name] for name in ("train", "sweep", "download")}
    for name, parser in {**parsers, "bench": bench_parser()}.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, (name, action.dest)
            if action.option_strings:  # positionals are required: no default
                assert "default" in action.help, (name, action.option_strings)


def test_a_failure_is_one_line_and_debug_shows_the_traceback(capsys, tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    status, _, err = _cli(capsys, "train", "--data", str(missing), "--out", str(tmp_path))
    assert status == 1 and err.count("\n") == 1
    assert err.startswith("error: ") and str(missing) in err
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        _cli(capsys, "train", "--data", str(missing), "--out", str(tmp_path), "--debug")
    monkeypatch.setenv("JAXFLOWERS_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        _cli(capsys, "train", "--data", str(missing), "--out", str(tmp_path))


@pytest.mark.parametrize("error, line", [
    (KeyError("x"), "error: KeyError: 'x'"),
    (RuntimeError("XLA failed\nthe rest of a long report"),
     "error: XLA failed (--debug or JAXFLOWERS_DEBUG=1 shows the rest)"),
])
def test_an_error_is_worded_for_people(capsys, tmp_path, monkeypatch, error, line):
    from jaxflowers import recipes

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(recipes.datasets, "load_data", fail)
    assert _cli(capsys, "train", "--out", str(tmp_path))[2] == line + "\n"


def _never_train(*args, **kwargs):
    raise AssertionError("train must not start")


@pytest.mark.parametrize("flag, where, reason", [
    ("--out", "{blocker}/out", "cannot write into {blocker}/out (Not a directory)"),
    ("--save", "{blocker}/net.zip", "cannot write into {blocker} (it is a file, not a folder)"),
    ("--checkpoint-dir", "{blocker}/ckpt", "cannot write into {blocker}/ckpt (Not a directory)"),
    ("--save", "{tmp}", "--save {tmp} is a folder; give a file name"),
])
def test_outputs_that_cannot_be_written_are_refused_before_training(capsys, tmp_path,
                                                                    monkeypatch, flag, where,
                                                                    reason):
    monkeypatch.setattr(jf, "train", _never_train)
    names = {"blocker": _blocked(tmp_path), "tmp": tmp_path}
    status, _, err = _cli(capsys, "train", "--out", str(tmp_path), flag, where.format(**names))
    assert status == 1 and err.startswith("error: ") and reason.format(**names) in err


def test_train_and_test_folders_with_other_classes_are_refused_naming_both(capsys, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(jf, "train", _never_train)
    monkeypatch.setenv("JAXFLOWERS_CACHE_DIR", str(tmp_path / "cache"))
    _class_folders(tmp_path / "data" / "train", classes=("cat", "dog"))
    _class_folders(tmp_path / "data" / "test", classes=("cat", "cow"))
    status, _, err = _cli(capsys, "train", "--data", str(tmp_path / "data"), "--out",
                          str(tmp_path))
    test, train = tmp_path / "data" / "test", tmp_path / "data" / "train"
    assert status == 1 and err == (f"error: {test} has the classes ('cat', 'cow') but {train} "
                                   "has ('cat', 'dog'); both need the same class folders\n")


def test_ctrl_c_while_loading_data_is_one_line_and_130(capsys, tmp_path, monkeypatch):
    from jaxflowers import recipes

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(recipes.datasets, "load_data", interrupted)
    status, _, err = _cli(capsys, "train", "--out", str(tmp_path))
    assert (status, err) == (130, "interrupted while loading the data; nothing was saved\n")
    monkeypatch.setattr(jf.data, "download_flowers", interrupted)
    status, _, err = _cli(capsys, "download", "flowers", str(tmp_path))
    assert status == 130 and err.startswith("interrupted while downloading; kept the partial")


def _kind(stop_reason: str) -> jf.StopReason:
    """The ``StopReason`` that ``train`` gives along with these words."""
    if " is NaN" in stop_reason or " is Inf" in stop_reason or "gradient" in stop_reason:
        return jf.StopReason.DIVERGED
    return jf.StopReason(stop_reason)


def _stopped_training(stop_reason: str):
    """A stand-in for ``jf.train`` that ran 3 iterations and stopped for ``stop_reason``."""
    def train(data, model, options, **kwargs):
        loss = np.array([2.3, 2.1, np.nan if "NaN" in stop_reason else 2.0])
        info = jf.TrainingInfo(
            iteration=np.arange(1, 4), epoch=np.ones(3, int), loss=loss,
            accuracy=np.full(3, 10.0), learn_rate=np.full(3, 1e-3),
            validation_iteration=np.zeros(0, int), validation_loss=np.zeros(0),
            validation_accuracy=np.zeros(0), stopped_early=stop_reason != "max epochs completed",
            stop_reason=stop_reason, stopped_by=_kind(stop_reason))
        return tiny_net(classes=tuple(data.class_names)), info
    return train


def test_a_diverged_run_prints_its_reason_and_exits_1(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(jf, "train", _stopped_training("training loss is NaN at iteration 3"))
    status, _, err = _cli(capsys, "train", "--out", str(tmp_path),
                          "--save", str(tmp_path / "net.zip"))
    metrics = tmp_path / "metrics.csv"
    assert status == 1 and err == (f"error: training loss is NaN at iteration 3; the history "
                                   f"is in {metrics}\n")
    assert len(metrics.read_text().splitlines()) == 1 + 3  # header + 3 iterations
    assert not (tmp_path / "net.zip").exists()  # a diverged network is not saved as a result


def test_ctrl_c_in_training_is_one_line_and_130(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(jf, "train", _stopped_training("interrupted"))
    status, _, err = _cli(capsys, "train", "--out", str(tmp_path))
    assert (status, err) == (130, "interrupted after iteration 3: no checkpoint was written "
                                  "(--checkpoint-dir DIR keeps one); kept "
                                  f"{tmp_path / 'metrics.csv'}\n")


def test_ctrl_c_while_testing_keeps_the_saved_network(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(jf, "train", _stopped_training("max epochs completed"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(jf, "predict", interrupted)
    status, out, err = _cli(capsys, "train", "--out", str(tmp_path),
                            "--save", str(tmp_path / "net.zip"))
    assert (status, err) == (130, f"interrupted while testing the network; kept "
                                  f"{tmp_path / 'metrics.csv'}, {tmp_path / 'net.zip'}\n")
    assert jf.load(tmp_path / "net.zip").class_names == tuple(str(d) for d in range(10))


def _noise_folders(root: pathlib.Path, per_class: int) -> pathlib.Path:
    """Class folders "bright" and "dark" of 32x32 noise PNGs, easy to tell apart."""
    rng = np.random.default_rng(0)
    for name, (low, high) in (("bright", (170, 256)), ("dark", (0, 86))):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(low, high, (32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def _cli_process(argv, tmp_path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "jaxflowers", *argv], cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg", **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_train_and_test_folders_unwritable_caches_save_and_metrics(tmp_path):
    """``train --data DIR`` on train/ + test/ folders, with both optional caches unwritable:
    it says which folder does what, warns once per cache, and keeps the network and metrics."""
    data = tmp_path / "data"
    _noise_folders(data / "train", 16)
    _noise_folders(data / "test", 4)
    blocker, out = _blocked(tmp_path), tmp_path / "out"
    process = _cli_process(["train", "--data", str(data), "--depth", "1", "--epochs", "2",
                            "--batch-size", "8", "--quiet", "--out", str(out),
                            "--save", str(out / "net.zip")], tmp_path,
                           JAXFLOWERS_CACHE_DIR=str(blocker / "cache"),
                           JAXFLOWERS_COMPILE_CACHE=str(blocker / "xla"))
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    assert (f"Data: {data}/train for training and {data}/test for testing: training on 32, "
            "testing on 8 images of 32x32") in stdout
    assert re.search(r"Test accuracy: [\d.]+% \(8 images\)", stdout), stdout
    warned = [line for line in stderr.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 2 and "Traceback" not in stderr, stderr  # one per cache
    assert "\r" not in stderr  # no resize bars in a log
    assert sum(f"compilation cache folder {blocker / 'xla'} cannot be written" in w
               for w in warned) == 1
    assert len((out / "metrics.csv").read_text().splitlines()) == 1 + 8  # 2 epochs of 4
    net = jf.load(out / "net.zip")
    assert net.class_names == ("bright", "dark") and net.input_shape == (32, 32, 3)


@pytest.mark.slow
@pytest.mark.parametrize("signal_name, status, words, notice", [
    ("SIGINT", 130, "interrupted", "Ctrl-C: "), ("SIGTERM", 143, r"terminated \(SIGTERM\)",
                                                 "SIGTERM: ")])
def test_a_stop_signal_checkpoints_says_where_and_resume_finishes_the_run(
        tmp_path, signal_name, status, words, notice):
    """Ctrl-C or SIGTERM (kill, Slurm's time limit) in training: the library's notice, then
    one line naming the checkpoint and what was kept (the history, the network so far), the
    shell's exit status, no traceback, no child left; --resume then finishes the run (once:
    both signals take the same stop path)."""
    import signal

    import psutil

    argv = ["train", "--depth", "1", "--epochs", "2", "--checkpoint-dir", str(tmp_path / "ck"),
            "--out", str(tmp_path / "out"), "--save", str(tmp_path / "out" / "net.safetensors")]
    process = _cli_process(argv, tmp_path, PYTHONUNBUFFERED="1")
    try:
        for line in process.stdout:  # the table's first row: training is under way
            if re.match(r" +1 +1 ", line):
                break
        children = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(getattr(signal, signal_name))
        _, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert process.returncode == status and "Traceback" not in stderr, stderr[-3000:]
    assert all(line.startswith(notice) for line in lines[:-1]), lines
    assert re.fullmatch(rf"{words} after iteration \d+: the checkpoint is in "
                        rf"{re.escape(str(tmp_path / 'ck'))}/iteration_\d+ \(continue with "
                        rf"--resume\); kept {re.escape(str(tmp_path / 'out' / 'metrics.csv'))}"
                        rf", {re.escape(str(tmp_path / 'out' / 'net.safetensors'))}"
                        rf", {re.escape(str(tmp_path / 'out' / 'training_progress.png'))}",
                        lines[-1]), lines
    assert jf.load(tmp_path / "out" / "net.safetensors").class_names == tuple("0123456789")
    assert not [c for c in children if c.is_running()]
    if signal_name == "SIGTERM":
        return  # the stop path writes the same checkpoint as for Ctrl-C, resumed below
    resumed = subprocess.run([sys.executable, "-m", "jaxflowers", *argv, "--resume", "--quiet"],
                             cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Test accuracy" in resumed.stdout
    rows = (tmp_path / "out" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * (1618 // 128)  # the whole run's history, resumed included


@pytest.mark.slow
def test_a_diverging_run_stops_and_the_cli_says_why(capsys, tmp_path):
    # Adam's steps are about the learning rate, whatever the gradient: 1e20 overflows.
    status, _, err = _cli(capsys, "train", "--depth", "1", "--epochs", "1", "--learn-rate",
                          "1e20", "--quiet", "--out", str(tmp_path), "--save",
                          str(tmp_path / "net.zip"))
    assert status == 1 and re.fullmatch(
        r"error: (training loss is (NaN|Inf)|gradient is not finite) at iteration \d+; the "
        rf"history is in {re.escape(str(tmp_path / 'metrics.csv'))}\n", err), err
    assert not (tmp_path / "net.zip").exists()


def test_each_run_gets_its_own_folder_and_a_bare_save_name_goes_into_it(capsys, tmp_path,
                                                                       monkeypatch):
    """Two runs in the same second: two run folders under runs/; --save NAME lands in the
    run folder, --save with a folder where it says; --plots none leaves out the figures."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(jf, "train", _stopped_training("max epochs completed"))
    status, first, _ = _cli(capsys, "train", "--save", "net.zip")
    assert status == 0
    folder = pathlib.Path(re.search(r"^Run folder: (\S+)$", first, re.M).group(1))
    assert folder.parent == pathlib.Path("runs")
    assert sorted(p.name for p in folder.iterdir()) == ["confusion_chart.png", "metrics.csv",
                                                        "net.zip"]  # (train draws the progress)
    assert jf.load(folder / "net.zip").class_names == tuple("0123456789")
    status, second, _ = _cli(capsys, "train", "--save", "./kept/net.zip", "--plots", "none")
    again = pathlib.Path(re.search(r"^Run folder: (\S+)$", second, re.M).group(1))
    assert status == 0 and again != folder and again.parent == pathlib.Path("runs")
    assert sorted(p.name for p in again.iterdir()) == ["metrics.csv"]
    assert (tmp_path / "kept" / "net.zip").is_file()
    assert second.splitlines()[-1] == f"Saved {again / 'metrics.csv'}, kept/net.zip"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "runs"]


def test_run_folders_of_one_second_are_numbered(tmp_path, monkeypatch):
    import datetime

    from jaxflowers.cli.outputs import new_run_folder

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 12, 1, 9, 5, 7)

    monkeypatch.setattr(datetime, "datetime", Frozen)
    made = [new_run_folder(tmp_path / "runs", suffix="-sweep").name for _ in range(3)]
    assert made == ["2026-12-01_09-05-07-sweep", "2026-12-01_09-05-07-sweep-2",
                    "2026-12-01_09-05-07-sweep-3"]


def test_runs_are_ignored_by_git():
    assert "/runs/" in (ROOT / ".gitignore").read_text().splitlines()
