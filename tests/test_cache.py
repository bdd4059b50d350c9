"""The resize cache: reuse without decoding, keys, integrity and its checks, where it lives
(its builds: test_cache_build.py; what it stores of each image: test_cache_rows.py)."""
import json
import os
import pathlib
import re

import numpy as np
import pytest
from image_folders import class_folders, expected_colours
from PIL import Image

from jaxflowers.data import ImageFolder, imread
from jaxflowers.data import cache as cache_lib


def _snapshot(root):
    """Every name under ``root`` with its mtime and size."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_mtime_ns, st.st_size)
    return out


def test_second_run_decodes_nothing_and_the_source_is_untouched(tmp_path, count_decodes):
    root = class_folders(tmp_path / "r")
    before = _snapshot(root)
    first = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    assert first.images[:, 0, 0].tolist() == expected_colours() and len(count_decodes) == 6
    second = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    np.testing.assert_array_equal(second.images, first.images)
    assert len(count_decodes) == 6, "an unchanged folder must not be decoded again"
    assert isinstance(second.images, np.memmap) and second.images.filename == first.cache_path
    assert _snapshot(root) == before, "the source folder must never be modified"
    assert sorted(os.listdir(tmp_path / "c")) == [
        os.path.basename(first.cache_path)[:-4] + ext
        for ext in (".checked", ".digests.npy", ".json", ".lock", ".moments.npy", ".npy")]


def test_a_changed_file_or_size_gives_a_new_cache(tmp_path, count_decodes):
    root = class_folders(tmp_path / "r")
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
    root = class_folders(tmp_path / "r")
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

    root = class_folders(tmp_path / "r")
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
    root = class_folders(tmp_path / "r")
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
    assert images[:, 0, 0].tolist() == expected_colours() and (images == images[:, :1, :1]).all()


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
    root = class_folders(tmp_path / "r")
    path = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c").cache_path
    assert digests == []  # built: digested while written, not read back
    again = ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "c")
    assert again.images[:, 0, 0].tolist() == expected_colours() and digests == []
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
    root = class_folders(tmp_path / "r")
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
    root = class_folders(tmp_path / "r")
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
    root = class_folders(tmp_path / "r")
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
        assert again.images[:, 0, 0].tolist() == expected_colours()
    assert digests == [path, path]


def test_cache_dir_from_argument_env_var_or_home(tmp_path, monkeypatch):
    root = class_folders(tmp_path / "r", per_class=1)
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
    root = class_folders(tmp_path / "r", per_class=1)
    first = ImageFolder(root, image_size=(2, 2), cache_dir=tmp_path / "c")
    stem = first.cache_path[:-4]
    os.remove(first.cache_path)  # make the next one build again
    stale = stem + ".npy.tmp-99999-deadbeef"
    open(stale, "wb").close()  # as left by a builder that was killed
    with pytest.warns(UserWarning, match="rebuilding"):
        ImageFolder(root, image_size=(2, 2), cache_dir=tmp_path / "c").images
    assert not os.path.exists(stale) and os.path.exists(stem + ".npy")
