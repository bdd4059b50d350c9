"""The fault table: what a user (or a hostile tester) can get wrong, and exactly what follows.

One place to read every fault and its outcome, through the public API and the CLI: the
message names the file or argument, nothing is lost, no child process is left behind.
Sections: mismatches refused before compiling; options; prediction; images and folders;
archives; caches; saved networks; the command line. Other modules' tests cover the same
machinery in depth (test_options, test_folder, test_download, test_cache, test_sweep).
"""
import contextlib
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
import warnings

import jax
import numpy as np
import pytest
from PIL import Image

import jaxflowers as jf

ROOT = pathlib.Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def _compiles():
    """Collects one entry per XLA compilation inside the block."""
    events = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


@pytest.fixture(scope="module")
def sets(digits):
    """Digits split 90/10, per class: (train, test)."""
    return digits.split_each_label(0.9, seed=0)


# ------------------------------------------------- mismatches refused before compiling

class _Foreign:
    """Builds a flax module outside jaxflowers.models with ``outputs`` logits."""

    @staticmethod
    def make(outputs):
        import flax.linen as nn

        class Linear(nn.Module):
            @nn.compact
            def __call__(self, x, train=False):
                return nn.Dense(outputs)(x.reshape(x.shape[0], -1))

        return Linear()


def _one_class(train, test):
    return jf.data.ImageSet(train.images[:40], np.zeros(40, int), ("only",)), {}


def _one_class_present(train, test):
    return train.subset(np.flatnonzero(train.labels == 3)), {}


def _reordered_validation(train, test):
    names = tuple(reversed(test.class_names))
    return train, {"validation_data": jf.data.ImageSet(test.images, test.labels, names)}


def _other_validation_classes(train, test):
    names = tuple("abcdefghij")
    return train, {"validation_data": jf.data.ImageSet(test.images, test.labels, names)}


def _smaller_validation_images(train, test):
    small = jf.data.ImageSet(np.zeros((4, 16, 16, 3), np.uint8), np.arange(4), test.class_names)
    return train, {"validation_data": small}


def _validation_uncropped(train, test):
    crop = jf.data.Augmentation(random_crop=(28, 28))
    return train, {"validation_data": test, "augmentation": crop}


MISMATCHES = {
    "model outputs != classes": (
        lambda t, v: (t, {}), lambda: jf.models.cifar_net(1, num_classes=3),
        r"the model has 3 outputs but the training data has 10 classes \('0', '1', .*; "
        r"build the model with num_classes=10"),
    "foreign model outputs != classes (eval_shape)": (
        lambda t, v: (t, {}), lambda: _Foreign.make(4),
        r"the model has 4 outputs but the training data has 10 classes"),
    "one class": (
        _one_class, lambda: jf.models.cifar_net(1, num_classes=1),
        r"the training data has 1 class \('only'\); a classifier needs at least 2"),
    "one class present": (
        _one_class_present, lambda: jf.models.cifar_net(1),
        r"holds images of 1 of its 10 classes \('3'\)"),
    "validation classes in another order": (
        _reordered_validation, lambda: jf.models.cifar_net(1),
        r"validation_data classes \('9', '8', .*\) differ from the training data's "
        r"\('0', '1', .*\): the same names in another order"),
    "validation with other classes": (
        _other_validation_classes, lambda: jf.models.cifar_net(1),
        r"validation_data classes \('a', 'b', .*\) differ .*: it lacks \('0', .*; "
        r"training lacks \('a', "),
    "validation images of another size": (
        _smaller_validation_images, lambda: jf.models.cifar_net(1),
        r"validation_data images are \(16, 16, 3\) but training feeds the network \(32, 32, 3\)"),
    "validation images not cropped like training": (
        _validation_uncropped, lambda: jf.models.cifar_net(1),
        r"validation_data images are \(32, 32, 3\) but training feeds the network \(28, 28, 3\)"),
}


@pytest.mark.parametrize("case", MISMATCHES)
def test_mismatch_is_refused_before_anything_compiles(sets, case):
    make_data, make_model, message = MISMATCHES[case]
    data, options = make_data(*sets)
    model = make_model()
    with _compiles() as compiled, pytest.raises(ValueError, match=message):
        jf.train(data, model, jf.TrainingOptions(mini_batch_size=16, max_epochs=1,
                                                 verbose=False, **options))
    assert compiled == []


def test_jaxflowers_models_declare_the_outputs_eval_shape_finds():
    """The checks trust a jaxflowers model's ``num_classes`` instead of tracing it."""
    from jaxflowers.training.inputs import model_outputs

    for model in (jf.models.cifar_net(2, num_classes=7), jf.models.resnet18(num_classes=5)):
        shape = jax.eval_shape(
            lambda x, m=model: m.init_with_output(jax.random.PRNGKey(0), x, train=False)[0],
            jax.ShapeDtypeStruct((1, 32, 32, 3), np.float32)).shape
        assert model_outputs(model, (32, 32, 3)) == shape[1]


# ------------------------------------------------------------------------- options

@pytest.mark.parametrize("options, message", [
    (dict(mini_batch_size=0), r"mini_batch_size=0 must be an integer >= 1"),
    (dict(solver="adamw"), r"solver='adamw' is not allowed; use one of sgdm, rmsprop, adam"),
    (dict(initial_learn_rate=float("nan")), r"initial_learn_rate=nan must be a finite number"),
    (dict(validation_data=[1, 2]), r"validation_data=list lacks images, labels, class_names"),
])
def test_a_bad_option_names_field_value_and_what_is_allowed(options, message):
    with pytest.raises(ValueError, match=message):
        jf.TrainingOptions(**options)


@pytest.mark.parametrize("options, message", [
    (dict(mini_batch_size=18), r"mini_batch_size=18 is not divisible by 4 devices; use a "
                               r"multiple of 4 or scale_for_devices"),
    (dict(mini_batch_size=4096), r"mini_batch_size=4096 is larger than the 1618 training images"),
])
def test_a_batch_that_cannot_be_split_is_refused_before_compiling(sets, options, message):
    with _compiles() as compiled, pytest.raises(ValueError, match=message):
        jf.train(sets[0], jf.models.cifar_net(1), jf.TrainingOptions(verbose=False, **options))
    assert compiled == []


# ----------------------------------------------------------- images and folders

def _class_folders(root: pathlib.Path, per_class: int = 3, classes=("a", "b"), size=(9, 7)):
    """PNG class folders; class c's image i is the colour (100 c, 20 i, 50)."""
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.new("RGB", size, (100 * c, 20 * i, 50)).save(root / name / f"{i}.png")
    return root


def test_a_truncated_image_is_named_and_no_cache_is_left(tmp_path):
    root = _class_folders(tmp_path / "photos")
    good = (root / "a" / "0.png").read_bytes()
    (root / "b" / "broken.png").write_bytes(good[:len(good) // 2])
    ds = jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "cache")
    with pytest.raises(OSError, match=r"cannot read image .*broken\.png: .*on_error='skip'"):
        ds.images
    assert not [p for p in os.listdir(tmp_path / "cache") if not p.endswith(".lock")]


def test_a_class_folder_without_images_is_named(tmp_path):
    root = _class_folders(tmp_path / "photos")
    (root / "c").mkdir()
    (root / "c" / "notes.txt").write_text("no pictures here")
    with pytest.raises(ValueError, match=f"class folder '{re.escape(str(root / 'c'))}' \\('c'\\) "
                                         r"contains no image files .*notes\.txt"):
        jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "cache")


# ------------------------------------------------------------------------ archives

def _archive(tmp_path, members: dict) -> tuple[str, str]:
    """A .tgz of ``members`` (name -> bytes) as a file:// URL, and its sha256."""
    import hashlib
    import io

    path = tmp_path / "photos.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path.as_uri(), hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_archive_with_the_wrong_sha256_is_deleted_and_nothing_extracted(tmp_path):
    url, _ = _archive(tmp_path, {"photos/a/1.jpg": b"x"})
    dest = tmp_path / "dest"
    with pytest.raises(jf.data.ChecksumError, match=r"sha256 mismatch for .*photos\.tgz: "
                                                    r"expected 0{64}"):
        jf.data.download_and_extract(url, dest, sha256="0" * 64, progress=False)
    assert os.listdir(dest) == []


def test_an_archive_escaping_its_folder_is_refused_whole(tmp_path):
    url, sha = _archive(tmp_path, {"photos/a/1.jpg": b"x", "../evil.sh": b"rm -rf ~"})
    dest = tmp_path / "dest"
    with pytest.raises(jf.data.UnsafeArchiveError, match=r"member '\.\./evil\.sh' has an "
                                                         r"absolute path or a '\.\.' component"):
        jf.data.download_and_extract(url, dest, sha256=sha, progress=False)
    assert not (tmp_path / "evil.sh").exists() and not (dest / "photos").exists()


# -------------------------------------------------------------------------- caches

def _blocked(tmp_path) -> pathlib.Path:
    """A file: folders "inside" it cannot be created, even by root."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    return blocker


def test_an_unwritable_resize_cache_folder_is_a_warning_and_the_images_load(tmp_path,
                                                                           monkeypatch):
    root = _class_folders(tmp_path / "photos")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    folder = _blocked(tmp_path) / "cache"
    with pytest.warns(UserWarning, match=f"resize cache folder {re.escape(str(folder))} cannot "
                                         "be written \\(Not a directory\\); going on without"):
        images = np.array(jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=folder).images)
    assert images[:, 0, 0].tolist() == [[100 * c, 20 * i, 50] for c in range(2) for i in range(3)]
    assert os.listdir(scratch) == []  # the temporary file is gone


def test_a_read_only_folder_with_a_valid_resize_cache_is_used(tmp_path, monkeypatch,
                                                              count_decodes):
    from jaxflowers.data import cache as cache_lib

    root = _class_folders(tmp_path / "photos")
    first = np.array(jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").images)
    monkeypatch.setattr(cache_lib, "unwritable", lambda folder: "Read-only file system")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").images
    np.testing.assert_array_equal(again, first)
    assert len(count_decodes) == 6  # the first build only


def test_a_corrupted_resize_cache_is_rebuilt_with_a_warning(tmp_path, count_decodes):
    root = _class_folders(tmp_path / "photos")
    path = jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").cache_path
    os.truncate(path, os.path.getsize(path) - 10)
    with pytest.warns(UserWarning, match=f"resize cache {re.escape(path)} is invalid .*; "
                                         "rebuilding it"):
        images = jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").images
    assert images[:, 0, 0].tolist()[3] == [100, 0, 50] and len(count_decodes) == 12


def test_an_unwritable_compilation_cache_folder_is_a_warning(tmp_path, monkeypatch):
    folder = _blocked(tmp_path) / "xla"
    before = jax.config.jax_compilation_cache_dir
    with pytest.warns(UserWarning, match=f"compilation cache folder {re.escape(str(folder))} "
                                         "cannot be written .*going on without the cache"):
        assert jf.enable_compilation_cache(folder) is None
    monkeypatch.setenv("JAXFLOWERS_COMPILE_CACHE", str(folder))
    with pytest.warns(UserWarning, match="set JAXFLOWERS_COMPILE_CACHE to another folder"):
        assert jf.enable_compilation_cache() is None
    assert jax.config.jax_compilation_cache_dir == before


# ------------------------------------------------------------------------- sweeps

def test_a_killed_sweep_worker_fails_only_its_job_and_no_process_is_left(tmp_path):
    import psutil
    import sweep_jobs

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    pool = jf.sweep.DevicePool(2, log_dir=tmp_path / "logs")
    try:
        killed = pool.submit(sweep_jobs.fail, "oom-killed")  # SIGKILL, as the OOM killer
        fine = pool.submit(sweep_jobs.add, 1, 2)
        error = killed.exception(timeout=120)
        assert isinstance(error, jf.sweep.JobError) and error.signal_name == "SIGKILL"
        assert "out of memory" in str(error) and "about to fail" in error.log_tail
        assert fine.result(timeout=120) == 3
    finally:
        pool.shutdown(wait=True)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(left, timeout=5)
    assert not alive, alive


# ---------------------------------------------------------------------- prediction

def test_predict_on_no_images_gives_an_empty_score_table():
    net = _tiny_net()
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
        jf.predict(_tiny_net(), images)


def _tiny_net(model=None, classes=("cat", "dog")) -> "jf.TrainedNet":
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


# ------------------------------------------------------------------ the command line

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

    from jaxflowers.cli.entry import _parser

    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("train", "download"):
        for action in commands.choices[name]._actions:
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
        return _tiny_net(classes=tuple(data.class_names)), info
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
    assert len(warned) == 3 and "Traceback" not in stderr, stderr  # a resize per folder
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
    shell's exit status, no traceback, no child left; --resume then finishes the run."""
    import signal

    import psutil

    argv = ["train", "--depth", "1", "--epochs", "3", "--checkpoint-dir", str(tmp_path / "ck"),
            "--out", str(tmp_path / "out"), "--save", str(tmp_path / "out" / "net.safetensors")]
    process = _cli_process(argv, tmp_path, PYTHONUNBUFFERED="1")
    try:
        for line in process.stdout:  # the table's first row: training is under way
            if re.match(r"\|\s+1 \|\s+1 \|", line):
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
                        rf", {re.escape(str(tmp_path / 'out' / 'net.safetensors'))}",
                        lines[-1]), lines
    assert jf.load(tmp_path / "out" / "net.safetensors").class_names == tuple("0123456789")
    assert not [c for c in children if c.is_running()]
    resumed = subprocess.run([sys.executable, "-m", "jaxflowers", *argv, "--resume", "--quiet"],
                             cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Test accuracy" in resumed.stdout
    rows = (tmp_path / "out" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * (1618 // 128)  # the whole run's history, resumed included


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
