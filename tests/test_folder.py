"""ImageFolder: scanning, labels, decoding of every format and mode, bad input, splits (remote
folders: test_folder_remote.py)."""
import io
import os
import re
import threading
import time

import numpy as np
import pytest
from image_folders import class_folders, save_image
from PIL import Image

import jaxflowers as jf
from jaxflowers.data import ImageFolder, ImageSet
from jaxflowers.data import scan as scan_lib


def _jpeg_bytes(seed=0, size=64):
    noise = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_labels_from_sorted_class_folders_found_recursively(tmp_path):
    for rel in ("zebra/1.png", "zebra/deep/er/2.png", "ant/3.png", "ant/4.png", "ant/x/5.png"):
        save_image(tmp_path / "root" / rel)
    ds = ImageFolder(tmp_path / "root", image_size=(8, 8), cache_dir=tmp_path / "c")
    assert ds.class_names == ("ant", "zebra")
    assert ds.counts() == {"ant": 3, "zebra": 2}
    assert ds.labels.dtype == np.int32 and ds.labels.tolist() == [0, 0, 0, 1, 1]
    assert [os.path.relpath(f, tmp_path / "root") for f in ds.files] == [
        "ant/3.png", "ant/4.png", "ant/x/5.png", "zebra/1.png", "zebra/deep/er/2.png"]
    flat = ImageFolder(tmp_path / "root", image_size=(8, 8), include_subfolders=False,
                       cache_dir=tmp_path / "c")
    assert flat.counts() == {"ant": 2, "zebra": 1}


def test_decodes_every_format_and_mode_to_rgb_uint8(tmp_path):
    deep = Image.fromarray(np.full((10, 12), 0x8000, np.uint16))  # 16-bit gray, mode I;16
    deep.save(save_image(tmp_path / "r" / "all" / "deep.png"))
    transparent = Image.new("RGB", (12, 10), (0, 0, 255)).convert("P")
    transparent.save(tmp_path / "r" / "all" / "palette_alpha.png", transparency=0)
    Image.new("RGB", (12, 10), (0, 0, 255)).convert("P").save(tmp_path / "r" / "all" / "pal.gif")
    cases = {  # name: (mode, colour written, RGB expected, tolerance)
        "rgb.jpg": ("RGB", (200, 30, 30), (200, 30, 30), 6),
        "gray.png": ("L", 100, (100, 100, 100), 0),
        "rgba.png": ("RGBA", (10, 20, 30, 0), (10, 20, 30), 0),  # alpha dropped, as imread
        "la.png": ("LA", (90, 255), (90, 90, 90), 0),
        "bilevel.bmp": ("1", 1, (255, 255, 255), 0),
        "rgb.bmp": ("RGB", (1, 2, 3), (1, 2, 3), 0),
        "rgb.tiff": ("RGB", (4, 5, 6), (4, 5, 6), 0),
        "cmyk.tif": ("CMYK", (0, 255, 255, 0), (255, 0, 0), 0),
        "cmyk.jpg": ("CMYK", (0, 255, 255, 0), (255, 0, 0), 8),
    }
    for name, (mode, color, _, _) in cases.items():
        save_image(tmp_path / "r" / "all" / name, color, mode=mode)
    save_image(tmp_path / "r" / "all" / "lossless.webp", (7, 8, 9), lossless=True)
    cases.update({"deep.png": (0, 0, (128, 128, 128), 0), "pal.gif": (0, 0, (0, 0, 255), 0),
                  "palette_alpha.png": (0, 0, (0, 0, 255), 0),
                  "lossless.webp": (0, 0, (7, 8, 9), 0)})
    ds = ImageFolder(tmp_path / "r", image_size=(10, 12), cache_dir=tmp_path / "c")
    assert ds.images.shape == (len(cases), 10, 12, 3) and ds.images.dtype == np.uint8
    for path, image in zip(ds.files, ds.images):
        _, _, want, tol = cases[os.path.basename(path)]
        got = image.reshape(-1, 3).astype(int)
        assert np.abs(got - want).max() <= tol, (path, got[0], want)


def test_exif_orientation_is_applied(tmp_path):
    pixels = np.zeros((10, 20, 3), np.uint8)  # 10 high, 20 wide: left half red, right blue
    pixels[:, :10, 0] = pixels[:, 10:, 2] = 255
    img = Image.fromarray(pixels)
    exif = img.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display": the red half goes on top
    img.save(save_image(tmp_path / "r" / "c" / "turned.jpg"), exif=exif.tobytes(), quality=95)
    image = ImageFolder(tmp_path / "r", image_size=(20, 10), cache_dir=tmp_path / "c").images[0]
    assert image[:8, :, 0].mean() > 200 and image[:8, :, 2].mean() < 50
    assert image[-8:, :, 2].mean() > 200 and image[-8:, :, 0].mean() < 50


def test_mixed_case_extensions_and_non_ascii_names(tmp_path):
    names = ("épine/Ñandú.JPG", "épine/b.Png", "épine/c.TIFF", "ромашка/花.jpeg", "ромашка/x.GIF")
    for rel in names:
        save_image(tmp_path / "r" / rel)
    ds = ImageFolder(tmp_path / "r", image_size=(4, 4), cache_dir=tmp_path / "c")
    assert ds.class_names == ("épine", "ромашка") and ds.counts() == {"épine": 3, "ромашка": 2}
    assert np.abs(ds.images.astype(int) - [200, 30, 30]).max() <= 12  # all five decoded
    assert not ds.skipped


def test_non_image_files_are_skipped_listed_and_warned(tmp_path):
    save_image(tmp_path / "r" / "a" / "1.png")
    save_image(tmp_path / "r" / "b" / "2.png")
    (tmp_path / "r" / "a" / "notes.txt").write_text("not an image")
    (tmp_path / "r" / "b" / "Thumbs.db").write_bytes(b"\0" * 10)
    (tmp_path / "r" / "LICENSE.txt").write_text("root-level files are not in any class")
    (tmp_path / "r" / "a" / ".DS_Store").write_bytes(b"hidden: ignored")
    with pytest.warns(UserWarning, match="skipped 2 non-image file"):
        ds = ImageFolder(tmp_path / "r", image_size=(4, 4), cache_dir=tmp_path / "c")
    assert len(ds) == 2 and ds.images.shape == (2, 4, 4, 3)
    assert sorted(os.path.basename(p) for p, _ in ds.skipped) == ["Thumbs.db", "notes.txt"]
    assert all("not an image" in why for _, why in ds.skipped)


def test_an_image_is_known_by_the_last_dot_of_its_own_name(tmp_path):
    """Only the file name's extension counts: not a dot of a folder above it, nor an inner one."""
    for rel in ("a/photo.v2.PNG", "a/album.jpg/inner.bmp", "a/archive.png.txt", "a/README",
                "a/trailing.", "a/x.tar.jpeg"):
        if rel.endswith((".PNG", ".bmp", ".jpeg")):
            save_image(tmp_path / "r" / rel)
        else:
            (tmp_path / "r" / rel).write_text("not an image")
    with pytest.warns(UserWarning, match="skipped 3 non-image file"):
        ds = ImageFolder(tmp_path / "r", image_size=(4, 4), cache_dir=tmp_path / "c",
                         include_subfolders=True)
    assert [os.path.relpath(f, tmp_path / "r") for f in ds.files] == [
        "a/album.jpg/inner.bmp", "a/photo.v2.PNG", "a/x.tar.jpeg"]
    assert sorted(os.path.basename(p) for p, _ in ds.skipped) == [
        "README", "archive.png.txt", "trailing."]


def test_a_fast_local_folder_is_listed_in_one_thread_a_slow_one_in_threads(tmp_path,
                                                                            monkeypatch):
    """Threads listing a local folder take turns holding the GIL, so one whose first class
    folder lists fast is listed in the calling thread; slow metadata (a network file system,
    here a sleep per file) gets the worker threads. The same listing either way."""
    root = class_folders(tmp_path / "r", per_class=3, classes=("a", "b", "c", "d"))
    real, threads, delay = scan_lib.LocalFolder.files, [], []

    def files(self, folder, recursive):
        threads.append(threading.current_thread())
        time.sleep(sum(delay))
        return real(self, folder, recursive)

    monkeypatch.setattr(scan_lib.LocalFolder, "files", files)
    # A listing counts as fast below 2 ms a folder: a loaded machine can miss that by
    # itself, so the fast case gets a bound no pause of the scheduler reaches.
    default = scan_lib.FAST_LISTING_S_PER_FOLDER
    monkeypatch.setattr(scan_lib, "FAST_LISTING_S_PER_FOLDER", 10.0)
    fast = ImageFolder(root, image_size=(4, 4), cache_dir=tmp_path / "c", workers=4)
    assert threads == [threading.current_thread()] * 4
    threads.clear()
    monkeypatch.setattr(scan_lib, "FAST_LISTING_S_PER_FOLDER", default)
    delay.append(0.05)  # 17 ms a file, 50 ms a folder
    slow = ImageFolder(root, image_size=(4, 4), cache_dir=tmp_path / "c", workers=4)
    assert len(threads) == 4 and threads[0] is threading.current_thread()
    assert all(t is not threading.current_thread() for t in threads[1:])
    assert slow.files == fast.files and slow.labels.tolist() == fast.labels.tolist()
    threads.clear()
    ImageFolder(root, image_size=(4, 4), cache_dir=tmp_path / "c", workers=1)
    assert threads == [threading.current_thread()] * 4, "workers=1: no threads"


def test_missing_empty_or_file_root_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*does not exist"):
        ImageFolder(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no class folders in .*empty"):
        ImageFolder(tmp_path / "empty")
    save_image(tmp_path / "flat" / "loose.png")
    with pytest.raises(ValueError, match="must sit in class folders"):
        ImageFolder(tmp_path / "flat")
    with pytest.raises(NotADirectoryError, match="loose.png"):
        ImageFolder(tmp_path / "flat" / "loose.png")


def test_class_folder_without_images_is_an_error_naming_it(tmp_path):
    save_image(tmp_path / "r" / "good" / "1.png")
    (tmp_path / "r" / "hollow").mkdir()
    with pytest.raises(ValueError, match="class folder .*hollow.* contains no image files"):
        ImageFolder(tmp_path / "r", cache_dir=tmp_path / "c")
    save_image(tmp_path / "r" / "hollow" / "inner" / "2.png")
    with pytest.raises(ValueError, match="hollow.*include_subfolders=True"):
        ImageFolder(tmp_path / "r", include_subfolders=False, cache_dir=tmp_path / "c")


def _bad_folder(root):
    save_image(root / "a" / "good1.png")
    save_image(root / "a" / "good2.png", (0, 200, 0))
    save_image(root / "b" / "good3.png", (0, 0, 200))
    (root / "a" / "truncated.jpg").write_bytes(_jpeg_bytes()[:1500])
    (root / "b" / "zero.jpg").write_bytes(b"")
    return root


def test_truncated_and_zero_byte_files_raise_naming_the_file(tmp_path):
    root = _bad_folder(tmp_path / "r")
    with pytest.raises(OSError, match=r"zero\.jpg: file is empty \(0 bytes\).*on_error='skip'"):
        ImageFolder(root, image_size=(4, 4), cache_dir=tmp_path / "c")
    (root / "b" / "zero.jpg").unlink()
    ds = ImageFolder(root, image_size=(4, 4), cache_dir=tmp_path / "c")
    with pytest.raises(OSError, match=r"truncated\.jpg: OSError: image file is truncated"):
        ds.images
    assert not [p for p in os.listdir(tmp_path / "c") if p.endswith((".npy", ".json"))
                or ".tmp-" in p], "a failed build must leave no cache and no temporary file"


def test_on_error_skip_leaves_bad_files_out_and_reports_them(tmp_path):
    root = _bad_folder(tmp_path / "r")
    with pytest.warns(UserWarning, match="zero.jpg"):
        ds = ImageFolder(root, image_size=(4, 4), on_error="skip", cache_dir=tmp_path / "c")
    with pytest.warns(UserWarning, match="truncated.jpg"):
        assert len(ds) == 3
    assert [os.path.basename(f) for f in ds.files] == ["good1.png", "good2.png", "good3.png"]
    assert ds.labels.tolist() == [0, 0, 1]
    assert ds.images[:, 0, 0].tolist() == [[200, 30, 30], [0, 200, 0], [0, 0, 200]]
    reasons = dict((os.path.basename(p), why) for p, why in ds.skipped)
    assert set(reasons) == {"truncated.jpg", "zero.jpg"} and "truncated" in reasons["truncated.jpg"]
    # The cache remembers the failure: the default on_error="raise" still names the file.
    (root / "b" / "zero.jpg").unlink()
    with pytest.raises(OSError, match="truncated.jpg"):
        ImageFolder(root, image_size=(4, 4), cache_dir=tmp_path / "c").images


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="running as root: chmod 000 does not stop root from reading "
                           "(test_unreadable_file_simulated covers the same path)")
def test_unreadable_file_chmod(tmp_path):
    save_image(tmp_path / "r" / "a" / "ok.png")
    locked = save_image(tmp_path / "r" / "a" / "locked.png")
    locked.chmod(0)
    with pytest.raises(OSError, match="locked.png.*Permission"):
        ImageFolder(tmp_path / "r", image_size=(4, 4), cache_dir=tmp_path / "c").images


def test_unreadable_file_simulated(tmp_path, monkeypatch):
    save_image(tmp_path / "r" / "a" / "ok.png")
    locked = str(save_image(tmp_path / "r" / "a" / "locked.png"))
    real = scan_lib._read_file

    def read(path):
        if path == locked:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(scan_lib, "_read_file", read)
    with pytest.raises(OSError, match="locked.png.*Permission denied"):
        ImageFolder(tmp_path / "r", image_size=(4, 4), cache_dir=tmp_path / "c").images
    with pytest.warns(UserWarning, match="locked.png"):
        ds = ImageFolder(tmp_path / "r", image_size=(4, 4), on_error="skip",
                         cache_dir=tmp_path / "c2")
        assert [os.path.basename(f) for f in ds.files] == ["ok.png"]


def test_one_pixel_image_is_resized_up(tmp_path):
    save_image(tmp_path / "r" / "dot" / "1x1.png", (9, 99, 199), size=(1, 1))
    images = ImageFolder(tmp_path / "r", image_size=(16, 24), cache_dir=tmp_path / "c").images
    assert images.shape == (1, 16, 24, 3) and (images == [9, 99, 199]).all()


def test_symlinked_class_folder_is_followed_and_loops_end(tmp_path):
    save_image(tmp_path / "elsewhere" / "cats" / "1.png")
    save_image(tmp_path / "elsewhere" / "cats" / "2.png")
    save_image(tmp_path / "r" / "dogs" / "3.png")
    (tmp_path / "r" / "cats").symlink_to(tmp_path / "elsewhere" / "cats", target_is_directory=True)
    (tmp_path / "elsewhere" / "cats" / "loop").symlink_to(tmp_path / "elsewhere" / "cats")
    ds = ImageFolder(tmp_path / "r", image_size=(4, 4), cache_dir=tmp_path / "c")
    assert ds.counts() == {"cats": 2, "dogs": 1}
    assert all(f.startswith(str(tmp_path / "r")) for f in ds.files)
    assert ds.images.shape == (3, 4, 4, 3)


def test_a_class_folder_linked_to_a_root_above_the_data_is_refused_at_once(tmp_path):
    """A class folder that is a link to ``/`` (or to a folder holding the data) would walk
    the whole file system; it is refused, naming it, before anything is read."""
    save_image(tmp_path / "r" / "dogs" / "3.png")
    (tmp_path / "r" / "everything").symlink_to("/", target_is_directory=True)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"class folder .*everything.* leads to '/', which "
                                         r"holds the data root"):
        ImageFolder(tmp_path / "r", image_size=(4, 4), cache_dir=tmp_path / "c")
    assert time.perf_counter() - start < 5
    (tmp_path / "r" / "everything").unlink()
    (tmp_path / "r" / "parent").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ValueError, match="holds the data root"):
        ImageFolder(tmp_path / "r", image_size=(4, 4), cache_dir=tmp_path / "c")


def test_links_from_inside_a_class_folder_to_outside_it_are_not_followed(tmp_path):
    save_image(tmp_path / "r" / "cats" / "1.png")
    save_image(tmp_path / "r" / "dogs" / "2.png")
    save_image(tmp_path / "outside" / "x.png")
    (tmp_path / "r" / "cats" / "away").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.warns(UserWarning, match="skipped 1 non-image file"):
        ds = ImageFolder(tmp_path / "r", image_size=(4, 4), cache_dir=tmp_path / "c")
    assert ds.counts() == {"cats": 1, "dogs": 1}
    assert ds.skipped == ((str(tmp_path / "r" / "cats" / "away"),
                           "a link to a folder outside its class folder, not followed"),)


@pytest.mark.parametrize("image_size", [(0, 8), (8,), (8, 8, 3), "big", (8.0, 8), -4, (True, 8)])
def test_bad_image_size_names_the_value(tmp_path, image_size):
    save_image(tmp_path / "r" / "a" / "1.png")
    with pytest.raises(ValueError, match="image_size must be"):
        ImageFolder(tmp_path / "r", image_size=image_size)


def test_bad_options_name_the_value(tmp_path):
    save_image(tmp_path / "r" / "a" / "1.png")
    with pytest.raises(ValueError, match=r"on_error must be one of \('raise', 'skip'\); got 'ign"):
        ImageFolder(tmp_path / "r", on_error="ignore")
    with pytest.raises(ValueError, match="workers must be a positive int"):
        ImageFolder(tmp_path / "r", workers=0)
    with pytest.raises(ValueError, match="storage_options apply to URL roots only"):
        ImageFolder(tmp_path / "r", storage_options={"anon": True})
    assert ImageFolder(tmp_path / "r", image_size=7).image_shape == (7, 7, 3)


def _three_classes(root, per_class=5):
    for c, name in enumerate(("a", "b", "c")):
        for i in range(per_class):
            save_image(root / name / f"{i}.png", (40 * c, 10 * i, 7))
    return root


def test_splits_and_subsets_share_the_parent_cache(tmp_path, count_decodes):
    ds = ImageFolder(_three_classes(tmp_path / "r"), image_size=(4, 4), cache_dir=tmp_path / "c")
    train, val, test = ds.split_each_label(0.6, 1, seed=3)  # fraction, then count per class
    assert (len(train), len(val), len(test)) == (9, 3, 3) and not count_decodes
    assert train.counts() == {"a": 3, "b": 3, "c": 3} and test.counts() == {"a": 1, "b": 1, "c": 1}
    assert sorted(train.files + val.files + test.files) == sorted(ds.files)
    assert test.images.shape == (3, 4, 4, 3) and len(count_decodes) == 15  # whole folder, once
    for part in (train, val):
        rows = [ds.files.index(f) for f in part.files]
        np.testing.assert_array_equal(part.images, ds.images[rows])
        np.testing.assert_array_equal(part.labels, ds.labels[rows])
    assert len(count_decodes) == 15, "subsets must index the parent's cache, not decode"
    assert ds.split_each_label(0.6, 1, seed=3)[0].files == train.files  # deterministic
    assert isinstance(ds.images, np.memmap)
    nested = train.subset([4, 0])
    assert nested.files == (train.files[4], train.files[0])
    with pytest.raises(IndexError, match=r"\[0, 9\)"):
        train.subset([9])


def test_split_that_empties_a_class_names_it(tmp_path):
    save_image(tmp_path / "r" / "many" / "1.png")
    save_image(tmp_path / "r" / "many" / "2.png")
    save_image(tmp_path / "r" / "many" / "3.png")
    save_image(tmp_path / "r" / "one" / "1.png")
    ds = ImageFolder(tmp_path / "r", image_size=(4, 4), cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="class 'one' .* empty in one part"):
        ds.split_each_label(0.5)


def test_duck_types_as_an_image_set(tmp_path):
    ds = ImageFolder(_three_classes(tmp_path / "r", 2), image_size=(5, 6), cache_dir=tmp_path / "c")
    loaded = ds.load()
    assert isinstance(loaded, ImageSet) and isinstance(ds.to_image_set(), ImageSet)
    assert len(loaded) == len(ds) == 6 and loaded.class_names == ds.class_names
    np.testing.assert_array_equal(loaded.images, ds.images)
    np.testing.assert_array_equal(loaded.labels, ds.labels)
    assert not ds.images.flags.writeable and ds.image_shape == loaded.image_shape == (5, 6, 3)


def test_every_flower_photo_decodes(shared_data, tmp_path, count_decodes):
    root = shared_data / "flowers-sample"
    ds = ImageFolder(root, image_size=(64, 64), cache_dir=tmp_path)
    assert ds.class_names == ("daisy", "dandelion", "roses", "sunflowers", "tulips")
    assert ds.counts() == dict.fromkeys(ds.class_names, 40) and not ds.skipped
    images = ds.images
    assert images.shape == (200, 64, 64, 3) and images.dtype == np.uint8
    assert len(count_decodes) == 200
    assert images.reshape(200, -1).std(axis=1).min() > 5, "every photo has real content"
    again = ImageFolder(root, image_size=(64, 64), cache_dir=tmp_path)
    np.testing.assert_array_equal(again.images, images)
    assert len(count_decodes) == 200, "a second ImageFolder must decode nothing"


def test_a_truncated_image_is_named_and_no_cache_is_left(tmp_path):
    root = class_folders(tmp_path / "photos")
    good = (root / "a" / "0.png").read_bytes()
    (root / "b" / "broken.png").write_bytes(good[:len(good) // 2])
    ds = jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "cache")
    with pytest.raises(OSError, match=r"cannot read image .*broken\.png: .*on_error='skip'"):
        ds.images
    assert not [p for p in os.listdir(tmp_path / "cache") if not p.endswith(".lock")]


def test_a_class_folder_without_images_is_named(tmp_path):
    root = class_folders(tmp_path / "photos")
    (root / "c").mkdir()
    (root / "c" / "notes.txt").write_text("no pictures here")
    with pytest.raises(ValueError, match=f"class folder '{re.escape(str(root / 'c'))}' \\('c'\\) "
                                         r"contains no image files .*notes\.txt"):
        jf.data.ImageFolder(root, image_size=(4, 5), cache_dir=tmp_path / "cache")
