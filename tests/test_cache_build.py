"""The resize cache's build: two processes at once, decode processes and their faults, bad
files, folders that cannot be written, and what a log shows."""
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import numpy as np
import pytest
from image_folders import class_folders, expected_colours
from PIL import Image

import jaxflowers as jf
from jaxflowers.data import ImageFolder
from jaxflowers.data import cache as cache_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_BUILDER = textwrap.dedent("""
    import os, sys, time, types
    # Bare package shells: the real __init__s import JAX, which this test does not need and
    # which would cost seconds per process on a small CI machine.
    for name, path in (("jaxflowers", "jaxflowers"), ("jaxflowers.data", "jaxflowers/data")):
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__path__ = [os.path.join({repo!r}, path)]
    from jaxflowers.data import imread
    from jaxflowers.data.folder import ImageFolder
    calls, real = [], imread.decode_image
    def slow(data, size):
        calls.append(1)
        time.sleep(0.02)  # keeps the two builds overlapping
        return real(data, size)
    imread.decode_image = slow
    open({ready!r} + str(os.getpid()), "w").close()
    while not os.path.exists({go!r}):
        time.sleep(0.002)
    ds = ImageFolder({root!r}, image_size=(4, 5), cache_dir={cache_dir!r}, workers=2)
    total = int(ds.images.astype("int64").sum())  # builds (or opens) the cache
    print(len(calls), total)
""")


def test_two_processes_building_at_once_leave_one_valid_cache(tmp_path):
    root = class_folders(tmp_path / "r", per_class=6)
    ready, go = str(tmp_path / "ready-"), str(tmp_path / "go")
    script = _BUILDER.format(repo=REPO, ready=ready, go=go, root=str(root),
                             cache_dir=str(tmp_path / "c"))
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    deadline = time.monotonic() + 40
    while len([p for p in os.listdir(tmp_path) if p.startswith("ready-")]) < 2:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate() for p in procs]
        time.sleep(0.01)
    open(go, "w").close()
    outputs = [p.communicate(timeout=40) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    decodes, sums = zip(*(map(int, out.split()) for out, _ in outputs))
    assert sum(decodes) == 12, f"exactly one process decodes, the other waits and reuses: {decodes}"
    assert sums[0] == sums[1]
    files = sorted(os.listdir(tmp_path / "c"))
    assert sorted(os.path.splitext(f)[1] for f in files) == [
        ".checked", ".json", ".lock", ".npy", ".npy", ".npy"], files  # moments, digests
    ds = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    assert int(ds.images.astype("int64").sum()) == sums[0]


def _mixed_folder(root):
    """Random-pixel PNGs of several sizes and modes (RGB, L, P, RGBA), so a build resizes
    and converts: what the decode processes write must match the threads to the byte."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(("a", "b")):
        (root / name).mkdir(parents=True)
        for i in range(5):
            image = Image.fromarray(rng.integers(0, 256, (7 + 2 * c, 9 + 3 * i, 3), np.uint8))
            image = (image, image.convert("L"), image.convert("P"), image.convert("RGBA"))[i % 4]
            image.save(root / name / f"{i}.png")
    return root


def _treat_as_many(monkeypatch):
    """From now on, 4 local files are "many" and this machine has CPUs to spare."""
    from jaxflowers.data import decode

    monkeypatch.setattr(decode, "PROCESS_MIN_FILES", 4)
    monkeypatch.setattr(decode, "PROCESS_MIN_CPUS", 1)


@pytest.fixture
def many_files(monkeypatch):
    """Builds of 4 or more local files run in decode processes."""
    _treat_as_many(monkeypatch)


def test_a_build_in_processes_equals_one_in_threads_to_the_byte(tmp_path, count_decodes,
                                                                  monkeypatch):
    root = _mixed_folder(tmp_path / "r")
    threads = ImageFolder(root, image_size=(6, 8), cache_dir=tmp_path / "t", workers=3)
    assert len(threads.images) == 10 and len(count_decodes) == 10
    _treat_as_many(monkeypatch)
    processes = ImageFolder(root, image_size=(6, 8), cache_dir=tmp_path / "p", workers=3)
    np.testing.assert_array_equal(processes.images, threads.images)
    assert len(count_decodes) == 10, "3 decode processes decode, not this process's threads"
    with open(threads.cache_path, "rb") as t, open(processes.cache_path, "rb") as p:
        assert t.read() == p.read()
    files = list(threads.files)  # forced either way through open_or_build, 2 processes
    forced = cache_lib.open_or_build(files, ["x"] * 10, _no_reading, image_size=(6, 8),
                                     workers=2, cache_dir=tmp_path / "f", processes=True)
    np.testing.assert_array_equal(forced.images, threads.images)


def _no_reading(path):
    raise AssertionError(f"decode processes read {path} themselves")


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _two_bad_files(root):
    class_folders(root, per_class=4)
    (root / "a" / "1.png").write_bytes(b"not an image")
    noise = np.random.default_rng(0).integers(0, 256, (30, 40, 3), np.uint8)
    Image.fromarray(noise).save(root / "b" / "2.png")
    whole = (root / "b" / "2.png").read_bytes()
    (root / "b" / "2.png").write_bytes(whole[:len(whole) // 2])  # a truncated download
    return root


def _without_addresses(reasons):
    return {row: re.sub(r" at 0x[0-9a-f]+", "", why) for row, why in reasons.items()}


def test_bad_files_are_skipped_and_named_from_decode_processes(tmp_path, many_files,
                                                               count_decodes):
    root = _two_bad_files(tmp_path / "r")
    files = [str(root / c / f"{i}.png") for c in "ab" for i in range(4)]
    built = {processes: cache_lib.open_or_build(files, ["x"] * 8, _read, image_size=(4, 5),
                                                cache_dir=tmp_path / str(processes),
                                                workers=2, on_error="skip",
                                                processes=processes)
             for processes in (False, True)}
    assert sorted(built[True].failed) == [1, 6]
    assert _without_addresses(built[True].failed) == _without_addresses(built[False].failed)
    np.testing.assert_array_equal(built[True].images, built[False].images)
    with pytest.warns(UserWarning, match="skipped 2 undecodable image"):
        ds = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c", workers=2,
                         on_error="skip")
        assert len(ds) == 6
    assert len(count_decodes) == 8, "only the threads' build decodes in this process"
    assert [os.path.basename(p) for p, _ in ds.skipped] == ["1.png", "2.png"]
    assert "UnidentifiedImageError" in ds.skipped[0][1] and "truncated" in ds.skipped[1][1]
    assert ds.images[:, 0, 0].tolist() == [e for i, e in enumerate(expected_colours(4))
                                           if i not in (1, 6)]


def test_a_bad_file_in_a_decode_process_raises_and_leaves_no_cache(tmp_path, many_files,
                                                                   count_decodes):
    root = _two_bad_files(tmp_path / "r")
    ds = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c", workers=2)
    with pytest.raises(OSError, match=r"cannot read image .*(a/1|b/2)\.png: .* on_error='skip'"):
        ds.images
    assert [f for f in os.listdir(tmp_path / "c") if not f.endswith(".lock")] == []
    assert count_decodes == []


def test_a_decode_process_writes_its_rows_and_imports_no_jax(tmp_path):
    root = class_folders(tmp_path / "r", per_class=2)
    files = [str(root / c / f"{i}.png") for c in "ab" for i in range(2)]
    shape = (4, 4, 5, 3)
    path = str(tmp_path / "cache.npy")
    offset = cache_lib._allocate(path, shape)
    job = {"path": path, "offset": offset, "shape": shape, "first": 2, "files": files[2:],
           "stop_at_error": True}
    code = ("import sys\nfrom jaxflowers.data import decode\ndecode.main()\n"
            "assert 'jax' not in sys.modules, 'the decode process imported jax'\n")
    result = subprocess.run([sys.executable, "-c", code], input=json.dumps(job), cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"done": 2, "failed": []}]
    images = np.load(path, mmap_mode="r")
    assert images[:2].max() == 0, "rows of other processes are left alone"
    assert images[2:, 0, 0].tolist() == expected_colours(2)[2:]


def test_a_decode_process_that_dies_fails_the_build_with_its_stderr(tmp_path, monkeypatch):
    from jaxflowers.data import decode

    root = class_folders(tmp_path / "r", per_class=3)
    monkeypatch.setattr(decode, "_MODULE", "jaxflowers.data.no_such_module")  # dies at start
    with pytest.raises(RuntimeError, match=r"(?s)exited with status 1 after 0 of its 3 images.*"
                                           r"No module named"):
        cache_lib.open_or_build([str(p) for p in sorted(root.glob("*/*.png"))], ["x"] * 6,
                                _read, image_size=(4, 5), cache_dir=tmp_path / "c", workers=2,
                                processes=True)
    assert [f for f in os.listdir(tmp_path / "c") if not f.endswith(".lock")] == []


def _blocked(tmp_path) -> pathlib.Path:
    """A file: folders "inside" it cannot be created, even by root."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    return blocker


def test_an_unwritable_resize_cache_folder_is_a_warning_and_the_images_load(tmp_path,
                                                                           monkeypatch):
    root = class_folders(tmp_path / "photos")
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

    root = class_folders(tmp_path / "photos")
    first = np.array(jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").images)
    monkeypatch.setattr(cache_lib, "unwritable", lambda folder: "Read-only file system")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").images
    np.testing.assert_array_equal(again, first)
    assert len(count_decodes) == 6  # the first build only


def test_a_corrupted_resize_cache_is_rebuilt_with_a_warning(tmp_path, count_decodes):
    root = class_folders(tmp_path / "photos")
    path = jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").cache_path
    os.truncate(path, os.path.getsize(path) - 10)
    with pytest.warns(UserWarning, match=f"resize cache {re.escape(path)} is invalid .*; "
                                         "rebuilding it"):
        images = jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").images
    assert images[:, 0, 0].tolist()[3] == [100, 0, 50] and len(count_decodes) == 12


def test_in_a_log_a_resize_is_one_line_not_a_bar(tmp_path, monkeypatch, capsys):
    """Where stderr is no terminal (a log, CI), the resize bar leaves one line, no \\r."""
    monkeypatch.setenv("JAXFLOWERS_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("a", "b"):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (9, 7), (80 * i, 20, 50)).save(tmp_path / "data" / name / f"{i}.png")
    ImageFolder(tmp_path / "data", image_size=(8, 8)).images
    err = capsys.readouterr().err
    assert "\r" not in err
    assert re.fullmatch(r"Resizing 6 images to 8x8[^:\n]*: done in [\d.]+ s\n", err), err
