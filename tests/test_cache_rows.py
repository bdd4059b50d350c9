"""What the resize cache stores of each image (its moments and its digest), what is derived
from them, and rows files that are missing or damaged."""
import json
import os

import numpy as np
import pytest
from PIL import Image

import jaxflowers as jf
from jaxflowers.data import ImageFolder


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
