"""The resize cache: reuse without decoding, keys, integrity, atomic process-safe builds."""
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
from image_folders import class_folders as _class_folders
from PIL import Image

import jaxflowers as jf
from jaxflowers.data import ImageFolder, imread
from jaxflowers.data import cache as cache_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _folder(root, per_class=3):
    """Classes a, b of uniform PNGs whose colour encodes (class, index)."""
    for c, name in enumerate(("a", "b")):
        for i in range(per_class):
            (root / name).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (9, 7), (100 * c, 20 * i, 50)).save(root / name / f"{i}.png")
    return root


def _expected(per_class=3):
    return [[100 * c, 20 * i, 50] for c in range(2) for i in range(per_class)]


def _snapshot(root):
    """Every name under ``root`` with its mtime and size."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_mtime_ns, st.st_size)
    return out


def test_second_run_decodes_nothing_and_the_source_is_untouched(tmp_path, count_decodes):
    root = _folder(tmp_path / "r")
    before = _snapshot(root)
    first = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    assert first.images[:, 0, 0].tolist() == _expected() and len(count_decodes) == 6
    second = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    np.testing.assert_array_equal(second.images, first.images)
    assert len(count_decodes) == 6, "an unchanged folder must not be decoded again"
    assert isinstance(second.images, np.memmap) and second.images.filename == first.cache_path
    assert _snapshot(root) == before, "the source folder must never be modified"
    assert sorted(os.listdir(tmp_path / "c")) == [
        os.path.basename(first.cache_path)[:-4] + ext
        for ext in (".checked", ".digests.npy", ".json", ".lock", ".moments.npy", ".npy")]


def test_a_changed_file_or_size_gives_a_new_cache(tmp_path, count_decodes):
    root = _folder(tmp_path / "r")
    old = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    old_images = np.array(old.images)
    Image.new("RGB", (9, 7), (1, 2, 3)).save(root / "a" / "1.png")
    st = os.stat(root / "a" / "1.png")
    os.utime(root / "a" / "1.png", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    new = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    assert new.images[1, 0, 0].tolist() == [1, 2, 3] and len(count_decodes) == 12
    np.testing.assert_array_equal(old.images, old_images)  # an open cache stays valid
    assert new.cache_path != old.cache_path
    bigger = ImageFolder(root, image_size=(6, 5), cache_dir=tmp_path / "c")
    assert bigger.images.shape == (6, 6, 5, 3) and len(count_decodes) == 18


def test_a_picture_replaced_keeping_its_size_and_mtime_is_noticed(tmp_path, count_decodes):
    """What ``cp -p``, tar and ``rsync -a`` do: another picture of the same size with the
    old mtime. The cache notices (a new inode or ctime) and the folder's older cache goes
    once the new one is complete, so there is one cache per folder and size."""
    root = _folder(tmp_path / "r")
    old = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    assert old.images[1, 0, 0].tolist() == [0, 20, 50]
    target = root / "a" / "1.png"
    st = os.stat(target)
    replacement = tmp_path / "other.png"
    Image.new("RGB", (9, 7), (7, 20, 50)).save(replacement)  # same size: one byte differs
    assert os.path.getsize(replacement) == st.st_size
    os.replace(replacement, target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(target).st_size, os.stat(target).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    new = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    assert new.images[1, 0, 0].tolist() == [7, 20, 50] and len(count_decodes) == 12
    kept = sorted(f for f in os.listdir(tmp_path / "c") if not f.endswith(".lock"))
    assert kept == [os.path.basename(new.cache_path)[:-4] + ext
                    for ext in (".checked", ".digests.npy", ".json", ".moments.npy",
                                ".npy")]  # none of the old one's files
    other_size = ImageFolder(root, image_size=(6, 5), cache_dir=tmp_path / "c")
    assert os.path.exists(new.cache_path) and os.path.exists(other_size.cache_path)


def test_content_fingerprints_notice_a_change_the_metadata_hides(tmp_path, monkeypatch,
                                                                   count_decodes):
    """``fingerprint="content"`` (``--verify-cache``) reads every file: it notices a change
    even where the stat fingerprint cannot (faked here by freezing it)."""
    from jaxflowers.data import scan as scan_lib

    root = _folder(tmp_path / "r")
    real = scan_lib._stat_file
    monkeypatch.setattr(scan_lib, "_stat_file", lambda path, fingerprint="stat": (
        real(path, fingerprint) if fingerprint == "content" else (*real(path)[:2], "frozen", "")))
    ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").images
    Image.new("RGB", (9, 7), (9, 9, 9)).save(root / "b" / "0.png")
    stale = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    assert stale.images[3, 0, 0].tolist() == [100, 0, 50]  # what frozen metadata gives
    checked = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c",
                          fingerprint="content")
    assert checked.images[3, 0, 0].tolist() == [9, 9, 9] and len(count_decodes) == 12
    with pytest.raises(ValueError, match="fingerprint='mtime'"):
        ImageFolder(root, fingerprint="mtime")


@pytest.mark.parametrize("damage", ["flip a byte", "flip a byte, times restored", "truncate",
                                    "garble the sidecar"])
def test_a_corrupted_cache_is_detected_and_rebuilt(tmp_path, count_decodes, damage):
    root = _folder(tmp_path / "r")
    path = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").cache_path
    ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").images  # a trusted reopen
    if damage.startswith("flip a byte"):
        st = os.stat(path)
        with open(path, "r+b") as f:
            f.seek(-40, os.SEEK_END)
            byte = f.read(1)
            f.seek(-40, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0xFF]))
        if damage.endswith("restored"):  # the size and times of the check: the ctime moves
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif damage == "truncate":
        os.truncate(path, os.path.getsize(path) - 100)
    else:
        with open(path[:-4] + ".json", "w") as f:
            f.write("{not json")
    with pytest.warns(UserWarning, match="invalid .* rebuilding"):
        again = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
        images = again.images
    assert len(count_decodes) == 12, "the damaged cache must be rebuilt, not used"
    assert images[:, 0, 0].tolist() == _expected() and (images == images[:, :1, :1]).all()


@pytest.fixture
def digests(monkeypatch):
    """The ``.npy`` files whose whole digest the resize cache reads, in order."""
    read = []
    real = cache_lib.file_digest

    def counting(path):
        if not re.search(r"\.(moments|digests)\.npy", path):  # small, always read
            read.append(path)
        return real(path)

    monkeypatch.setattr(cache_lib, "file_digest", counting)
    return read


def test_a_cache_unchanged_since_its_last_check_is_not_read_again(tmp_path, digests,
                                                                  count_decodes):
    """The build records its file's stamp with its digest, so a reopen reads nothing of a
    cache of many gigabytes; a new stamp (a copy, a restore, a touch) is read in full once,
    then trusted again; ``fingerprint="content"`` reads it at every open."""
    root = _folder(tmp_path / "r")
    path = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").cache_path
    assert digests == []  # built: digested while written, not read back
    again = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    assert again.images[:, 0, 0].tolist() == _expected() and digests == []
    os.utime(path)  # the same bytes, a new stamp
    assert ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").images.shape[0] == 6
    assert digests == [path]
    ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").images
    assert digests == [path], "checked once for the new stamp, then trusted"
    content = [ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c",
                           fingerprint="content").cache_path for _ in range(3)]
    assert digests == [path] + content[1:] and len(count_decodes) == 12  # its own cache


def test_a_check_recorded_for_another_digest_or_file_is_not_trusted(tmp_path, digests):
    """The record holds (digest, stamp): a record left by an older cache, damaged, or of
    another file is ignored and the file is read in full."""
    root = _folder(tmp_path / "r")
    path = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").cache_path
    record = path[:-4] + ".checked"
    stamp = json.loads(pathlib.Path(record).read_text())["stamp"]
    for text in ('{"xxh3": "0", "stamp": "%s"}' % stamp, "{not json", '["a", "b"]'):
        pathlib.Path(record).write_text(text)
        ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").images
    assert digests == [path] * 3
    assert json.loads(pathlib.Path(record).read_text())["stamp"] == stamp  # recorded again


def _damage_keeping_the_record(path: str) -> None:
    """Change the last byte of the cache at ``path`` and record its new stamp as checked: what
    no stamp can show (a disk's silent damage)."""
    record = path[:-4] + ".checked"
    digest = json.loads(pathlib.Path(record).read_text())["xxh3"]
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\x07")
    pathlib.Path(record).write_text(json.dumps(
        {"xxh3": digest, "stamp": cache_lib.file_stamp(os.stat(path))}))


@pytest.mark.parametrize("fingerprint", ["stat", "content"])
def test_a_cache_changed_in_place_keeping_its_stamp_is_caught_only_by_content(
        tmp_path, fingerprint):
    """The default trusts a cache whose stamp was checked, as it trusts the images' own
    stamps; ``fingerprint="content"`` reads the cache again and rebuilds it."""
    root = _folder(tmp_path / "r")
    opened = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c",
                         fingerprint=fingerprint)
    _damage_keeping_the_record(opened.cache_path)
    again = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c",
                        fingerprint=fingerprint)
    if fingerprint == "stat":
        assert again.images[-1, -1, -1].tolist() == [100, 40, 7]
    else:
        with pytest.warns(UserWarning, match="digest does not match .* rebuilding"):
            assert again.images[-1, -1, -1].tolist() == [100, 40, 50]


def test_a_read_only_cache_folder_is_checked_in_full_at_every_open(tmp_path, monkeypatch,
                                                                   digests):
    """Where the record cannot be written, nothing fails: each open reads the whole file."""
    root = _folder(tmp_path / "r")
    path = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").cache_path
    os.utime(path)
    real = cache_lib.write_json_atomic

    def read_only(target, record):
        if str(target).endswith(".checked"):
            raise PermissionError(13, "Permission denied", str(target))
        return real(target, record)

    monkeypatch.setattr(cache_lib, "write_json_atomic", read_only)
    for _ in range(2):
        again = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
        assert again.images[:, 0, 0].tolist() == _expected()
    assert digests == [path, path]


def test_cache_dir_from_argument_env_var_or_home(tmp_path, monkeypatch):
    root = _folder(tmp_path / "r", per_class=1)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("JAXFLOWERS_CACHE_DIR", raising=False)
    assert cache_lib.default_cache_dir() == str(tmp_path / "home" / ".cache" / "jaxflowers")
    home = ImageFolder(root, image_size=(2, 2)).cache_path
    assert home.startswith(str(tmp_path / "home" / ".cache" / "jaxflowers" / "r-2x2-"))
    monkeypatch.setenv("JAXFLOWERS_CACHE_DIR", str(tmp_path / "env"))
    assert ImageFolder(root, image_size=(2, 2)).cache_path.startswith(str(tmp_path / "env"))
    given = ImageFolder(root, image_size=(2, 2), cache_dir=tmp_path / "arg").cache_path
    assert given.startswith(str(tmp_path / "arg"))


def test_decode_is_antialiased(tmp_path):
    checker = (np.indices((64, 64)).sum(axis=0) % 2 * 255).astype(np.uint8)
    Image.fromarray(checker).save(tmp_path / "checker.png")
    small = imread.decode_image((tmp_path / "checker.png").read_bytes(), (8, 8))
    # Nearest-neighbour would give pure black or white; a reducing filter averages to grey.
    assert small.shape == (8, 8, 3) and np.abs(small[1:-1, 1:-1].astype(int) - 128).max() < 10


def test_key_covers_files_fingerprints_size_and_method(monkeypatch):
    key = cache_lib.cache_key(["a", "b"], ["1:2", "3:4"], (8, 8))
    assert key != cache_lib.cache_key(["b", "a"], ["3:4", "1:2"], (8, 8))  # order = rows
    assert key != cache_lib.cache_key(["a", "b"], ["1:2", "3:5"], (8, 8))
    assert key != cache_lib.cache_key(["a", "b"], ["1:2", "3:4"], (8, 9))
    monkeypatch.setattr(cache_lib, "RESIZE_METHOD", "pil-bicubic")
    assert key != cache_lib.cache_key(["a", "b"], ["1:2", "3:4"], (8, 8))


def test_stale_temporary_files_are_cleared(tmp_path):
    root = _folder(tmp_path / "r", per_class=1)
    first = ImageFolder(root, image_size=(2, 2), cache_dir=tmp_path / "c")
    stem = first.cache_path[:-4]
    os.remove(first.cache_path)  # make the next one build again
    stale = stem + ".npy.tmp-99999-deadbeef"
    open(stale, "wb").close()  # as left by a builder that was killed
    with pytest.warns(UserWarning, match="rebuilding"):
        ImageFolder(root, image_size=(2, 2), cache_dir=tmp_path / "c").images
    assert not os.path.exists(stale) and os.path.exists(stem + ".npy")


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
    root = _folder(tmp_path / "r", per_class=6)
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
    _folder(root, per_class=4)
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
    assert ds.images[:, 0, 0].tolist() == [e for i, e in enumerate(_expected(4)) if i not in (1, 6)]


def test_a_bad_file_in_a_decode_process_raises_and_leaves_no_cache(tmp_path, many_files,
                                                                   count_decodes):
    root = _two_bad_files(tmp_path / "r")
    ds = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c", workers=2)
    with pytest.raises(OSError, match=r"cannot read image .*(a/1|b/2)\.png: .* on_error='skip'"):
        ds.images
    assert [f for f in os.listdir(tmp_path / "c") if not f.endswith(".lock")] == []
    assert count_decodes == []


def test_a_decode_process_writes_its_rows_and_imports_no_jax(tmp_path):
    root = _folder(tmp_path / "r", per_class=2)
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
    assert images[2:, 0, 0].tolist() == _expected(2)[2:]


def test_a_decode_process_that_dies_fails_the_build_with_its_stderr(tmp_path, monkeypatch):
    from jaxflowers.data import decode

    root = _folder(tmp_path / "r", per_class=3)
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


def _noisy_folder(root, per_class=6):
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)).save(
                root / name / f"{i}.png")
    return root


def test_a_cache_stores_each_images_moments_and_statistics_are_summed_from_them(tmp_path,
                                                                                monkeypatch):
    """Built with the images: each row's per-channel sum and sum of squares. A folder's (and
    a subset's) channel statistics then read no image, and equal those of the images."""
    from jaxflowers.data import moments as moments_lib

    folder = ImageFolder(_noisy_folder(tmp_path / "r"), image_size=(6, 7),
                         cache_dir=tmp_path / "c")
    pixels = folder.images.reshape(len(folder), -1, 3).astype(np.int64)
    np.testing.assert_array_equal(folder.row_moments(),
                                  np.stack([pixels.sum(1), (pixels**2).sum(1)], 1))
    train, _ = folder.split_each_label(0.5, seed=3)
    expected = [moments_lib.channel_stats(part.load()) for part in (folder, train)]
    reopened = ImageFolder(tmp_path / "r", image_size=(6, 7), cache_dir=tmp_path / "c")
    monkeypatch.setattr(moments_lib, "read_rows", lambda *a: 1 / 0)  # no image is read
    for got, want in zip([moments_lib.channel_stats(f) for f in
                          (reopened, reopened.split_each_label(0.5, seed=3)[0])], expected):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_stored_moments_leave_out_undecodable_files_as_the_images_do(tmp_path):
    """With on_error="skip", an undecodable file's row is left out of the sums too."""
    from jaxflowers.data.moments import channel_stats

    root = _noisy_folder(tmp_path / "r")
    (root / "a" / "broken.png").write_bytes(b"not a png")
    with pytest.warns(UserWarning, match="broken.png"):
        folder = ImageFolder(root, image_size=(6, 7), cache_dir=tmp_path / "c",
                             on_error="skip")
        assert len(folder) == 12 and folder.row_moments().shape == (12, 2, 3)
    for a, b in zip(channel_stats(folder), channel_stats(folder.load().images)):
        np.testing.assert_array_equal(a, b)


def test_a_cache_stores_each_images_digest_and_a_sets_digest_is_made_from_them(
        tmp_path, monkeypatch):
    """Built with the images: each row's xxh3-64. A folder's (and a subset's) digest then
    reads no image and equals that of the same images and labels held in memory; a pixel, a
    label or the order changes it."""
    import xxhash

    from jaxflowers.data import digests as digests_lib

    folder = ImageFolder(_noisy_folder(tmp_path / "r"), image_size=(6, 7),
                         cache_dir=tmp_path / "c")
    assert folder.row_digests().tolist() == [xxhash.xxh3_64_intdigest(np.ascontiguousarray(i))
                                             for i in folder.images]
    train, _ = folder.split_each_label(0.5, seed=3)
    in_memory = [part.load() for part in (folder, train)]
    expected = [digests_lib.set_digest(part) for part in in_memory]
    reopened = ImageFolder(tmp_path / "r", image_size=(6, 7), cache_dir=tmp_path / "c")
    monkeypatch.setattr(digests_lib, "read_rows", lambda *a: 1 / 0)  # no image is read
    assert [digests_lib.set_digest(f) for f in
            (reopened, reopened.split_each_label(0.5, seed=3)[0])] == expected
    monkeypatch.undo()
    images, labels = np.array(in_memory[0].images), np.array(in_memory[0].labels)
    images[5, 2, 3, 1] ^= 1
    relabelled = labels.copy()
    relabelled[0] = 1 - relabelled[0]
    others = [jf.data.ImageSet(*pair, folder.class_names) for pair in (
        (images, labels), (in_memory[0].images, relabelled),
        (in_memory[0].images[::-1], labels[::-1]))]
    assert len({expected[0], *map(digests_lib.set_digest, others)}) == 4


@pytest.mark.parametrize("kind", ["moments", "digests"])
@pytest.mark.parametrize("damage", ["delete", "flip a byte", "an old sidecar"])
def test_missing_or_damaged_rows_files_are_not_used_and_the_images_stay(tmp_path, count_decodes,
                                                                        damage, kind):
    """What a cache stores of each row is checked against the sidecar's digest: missing,
    damaged, or a cache built without it (an older sidecar) gives None, the statistics or the
    set's digest read the images (the same result), and the cache itself is not rebuilt."""
    from jaxflowers.data.digests import set_digest
    from jaxflowers.data.moments import channel_stats

    derive, stored = {"moments": (channel_stats, "row_moments"),
                      "digests": (lambda d: [set_digest(d)], "row_digests")}[kind]
    root = _noisy_folder(tmp_path / "r")
    folder = ImageFolder(root, image_size=(6, 7), cache_dir=tmp_path / "c")
    expected = derive(folder.load())
    stem = folder.cache_path[:-4]
    decodes = len(count_decodes)
    if damage == "delete":
        os.remove(f"{stem}.{kind}.npy")
    elif damage == "flip a byte":
        with open(f"{stem}.{kind}.npy", "r+b") as f:
            f.seek(-3, os.SEEK_END)
            byte = f.read(1)
            f.seek(-3, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0x01]))
    else:
        with open(stem + ".json", encoding="utf-8") as f:
            info = json.load(f)
        del info[f"{kind}_xxh3"]
        with open(stem + ".json", "w", encoding="utf-8") as f:
            json.dump(info, f)
    again = ImageFolder(root, image_size=(6, 7), cache_dir=tmp_path / "c")
    assert getattr(again, stored)() is None
    for a, b in zip(derive(again), expected):
        np.testing.assert_array_equal(a, b)
    assert len(count_decodes) == decodes and again.cache_path == folder.cache_path
