"""A folder's checked listing (``ImageFolder.save_listing``, ``listing=``, ``recipes.share_plan``):
what a sweep's caller hands its workers so they neither list the folder nor read the resize
cache's digest again, and every case where they must not trust it."""
import json
import os
import warnings

import numpy as np
import pytest
from image_folders import class_folders

from jaxflowers import recipes
from jaxflowers.data import ImageFolder
from jaxflowers.data import cache as cache_lib
from jaxflowers.data import scan as scan_lib


@pytest.fixture
def listed(tmp_path):
    """(root, the cache folder, a listing written by a folder that built its cache)."""
    root = class_folders(tmp_path / "r", per_class=4, classes=("a", "b", "c"))
    folder = ImageFolder(root, image_size=(6, 5), cache_dir=tmp_path / "c")
    assert folder.save_listing(tmp_path / "listing.json")
    return root, tmp_path / "c", tmp_path / "listing.json"


def _forbid_scan_and_digest(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("listed the folder or read the cache's digest again")

    monkeypatch.setattr(scan_lib, "scan", forbidden)
    monkeypatch.setattr(cache_lib, "file_digest", forbidden)


def test_a_listing_opens_the_same_images_without_listing_or_checking_again(listed,
                                                                            monkeypatch):
    root, cache_dir, listing = listed
    scanned = ImageFolder(root, image_size=(6, 5), cache_dir=cache_dir)
    scanned_test = scanned.split_each_label(0.5, seed=3)[1].images
    scanned.images
    _forbid_scan_and_digest(monkeypatch)
    opened = ImageFolder(root, image_size=(6, 5), cache_dir=cache_dir, listing=listing)
    assert opened.listed_from == os.fspath(listing) and scanned.listed_from is None
    assert opened.files == scanned.files and opened.class_names == ("a", "b", "c")
    assert opened.labels.tolist() == scanned.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    np.testing.assert_array_equal(opened.images, scanned.images)
    train, test = opened.split_each_label(0.5, seed=3)  # subsets share the listed cache
    assert train.listed_from == os.fspath(listing)
    np.testing.assert_array_equal(test.images, scanned_test)


def test_a_cache_changed_since_its_listing_is_checked_again(listed, monkeypatch):
    """Any rewrite of the cache file changes its stamp: the folder is listed and the cache
    checked again, and a cache whose bytes changed is rebuilt, never handed out."""
    root, cache_dir, listing = listed
    path = json.loads(listing.read_text())["cache"]["path"]
    good = np.load(path).copy()
    damaged = np.load(path, mmap_mode="r+")
    damaged[0] = 255 - damaged[0]
    damaged.flush()
    del damaged
    digests = []
    monkeypatch.setattr(cache_lib, "file_digest",
                        lambda p, real=cache_lib.file_digest: digests.append(p) or real(p))
    with pytest.warns(UserWarning, match="digest does not match"):
        opened = ImageFolder(root, image_size=(6, 5), cache_dir=cache_dir, listing=listing)
        images = opened.images
    assert opened.listed_from is None and digests
    np.testing.assert_array_equal(images, good)


@pytest.mark.parametrize("change", ["image_size", "fingerprint", "cache_dir", "on_error",
                                    "include_subfolders"])
def test_a_listing_made_with_other_settings_is_not_used(listed, change):
    root, cache_dir, listing = listed
    kwargs = dict(image_size=(6, 5), cache_dir=cache_dir, listing=listing)
    kwargs[change] = {"image_size": (5, 6), "fingerprint": "content",
                      "cache_dir": cache_dir.parent / "other", "on_error": "skip",
                      "include_subfolders": False}[change]
    opened = ImageFolder(root, **kwargs)
    assert opened.listed_from is None and len(opened) == 12
    assert opened.images.shape == (12, *opened.image_size, 3)


@pytest.mark.parametrize("damage", ["missing", "not JSON", "truncated lists", "other folder"])
def test_a_missing_or_damaged_listing_lists_the_folder_instead(listed, tmp_path, damage):
    root, cache_dir, listing = listed
    data = json.loads(listing.read_text())
    if damage == "missing":
        listing.unlink()
    elif damage == "not JSON":
        listing.write_text("{\"format\": 1, \"sett")
    elif damage == "truncated lists":
        data["labels"] = data["labels"][:-1]
        listing.write_text(json.dumps(data))
    else:  # a listing of another folder passed by mistake
        other = class_folders(tmp_path / "other", per_class=4, classes=("a", "b", "c"))
        data["settings"]["root"] = os.fspath(other)
        listing.write_text(json.dumps(data))
    opened = ImageFolder(root, image_size=(6, 5), cache_dir=cache_dir, listing=listing)
    assert opened.listed_from is None and opened.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4


def test_a_cache_not_kept_on_disk_writes_no_listing(tmp_path, monkeypatch):
    root = class_folders(tmp_path / "r")
    monkeypatch.setattr(cache_lib, "unwritable", lambda folder: "Read-only file system")
    folder = ImageFolder(root, image_size=(4, 4), cache_dir=tmp_path / "c")
    with pytest.warns(UserWarning, match="cannot be written"):
        assert folder.save_listing(tmp_path / "listing.json") is False
    assert not (tmp_path / "listing.json").exists()


def test_share_plan_lists_each_folder_once_for_every_loader(tmp_path, monkeypatch):
    """The sweep's caller shares its plan: loading it opens every part from its listing."""
    for part in ("train", "test"):
        class_folders(tmp_path / "data" / part, per_class=5, classes=("x", "y"))
    plan = recipes.data_plan(str(tmp_path / "data"), image_size=(8, 8),
                             validation_fraction=0.2, seed=1)
    monkeypatch.setenv("JAXFLOWERS_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "shared").mkdir()
    shared, folders = recipes.share_plan(plan, tmp_path / "shared")
    assert sorted(shared["listings"]) == ["test", "train"] and len(folders) == 2
    assert json.loads(json.dumps(shared)) == shared  # still JSON, as jobs receive it
    expected = recipes.load_plan(plan)
    for part in expected:
        part.images
    _forbid_scan_and_digest(monkeypatch)
    sets = recipes.load_plan(shared)
    for got, want in zip(sets, expected):
        assert got.listed_from is not None
        np.testing.assert_array_equal(got.images, want.images)
        assert got.labels.tolist() == want.labels.tolist()


def test_share_plan_into_an_unusable_folder_warns_and_loaders_list_the_folders(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("JAXFLOWERS_CACHE_DIR", str(tmp_path / "cache"))
    class_folders(tmp_path / "data", per_class=5, classes=("x", "y"))
    plan = recipes.data_plan(str(tmp_path / "data"), image_size=(8, 8))
    (tmp_path / "a file").write_text("not a folder")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shared, _ = recipes.share_plan(plan, tmp_path / "a file")
    assert "listings" not in shared
    assert any("cannot save the listing" in str(w.message) and "a file" in str(w.message)
               for w in caught)
    train, _, test = recipes.load_plan(shared)
    assert train.listed_from is None and len(train) + len(test) == 10
