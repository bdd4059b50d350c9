"""Rows of a memory-mapped set: the same values as indexing, with exactly their pages advised
ahead (a scattered read of a set larger than memory otherwise reads several times its bytes)."""
import mmap

import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.data import mapped
from jaxflowers.data.feed import read_rows


@pytest.fixture
def on_disk(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (64, 40, 40, 3), dtype=np.uint8)
    np.save(tmp_path / "images.npy", images)
    return images, np.load(tmp_path / "images.npy", mmap_mode="r")


@pytest.fixture
def advice(monkeypatch):
    """The (address, length) of each advice given, in order."""
    calls = []

    def record(address, length, option):
        assert option == mmap.MADV_WILLNEED
        calls.append((address, length))
        return 0

    monkeypatch.setattr(mapped, "_libc_madvise", lambda: record)
    return calls


@pytest.mark.parametrize("rows", [[5, 9, 2, 9, 63, 0], list(range(64))[::-1], [], [7]])
def test_rows_of_a_memory_map_equal_plain_indexing(on_disk, rows):
    images, memory_map = on_disk
    out = mapped.take_rows(memory_map, rows)
    np.testing.assert_array_equal(out, images[np.asarray(rows, int)])
    assert type(out) is np.ndarray and out.flags.writeable and out.flags.c_contiguous
    view = memory_map[3:60:4]  # a strided view of the map, and an array in memory
    np.testing.assert_array_equal(mapped.take_rows(view, [1, 0, 13]), images[3:60:4][[1, 0, 13]])
    np.testing.assert_array_equal(mapped.take_rows(images, rows), images[np.asarray(rows, int)])


def test_each_rows_pages_are_advised_adjacent_rows_in_one_range(on_disk, advice):
    _, memory_map = on_disk
    row = 40 * 40 * 3
    mapped.take_rows(memory_map, [9, 3, 4, 5, 20])
    base = memory_map.ctypes.data
    page = mmap.PAGESIZE
    assert len(advice) == 3  # rows 3-5 merged; 9 and 20 alone
    for (address, length), (first, last) in zip(sorted(advice), [(3, 6), (9, 10), (20, 21)]):
        start, end = base + first * row, base + last * row
        assert address % page == 0 and start - page < address <= start and address + length >= end
        assert address + length <= end + page  # no more than the rows' own pages


def test_a_large_take_advises_block_after_block_ahead_of_its_copy(on_disk, advice, monkeypatch):
    images, memory_map = on_disk
    monkeypatch.setattr(mapped, "_AHEAD_BYTES", 3 * 40 * 40 * 3)  # blocks of three rows
    copied = []
    take = np.take
    monkeypatch.setattr(mapped.np, "take", lambda a, rows, **k: copied.append(len(advice))
                        or take(a, rows, **k))
    rows = np.arange(0, 64, 2)  # 32 rows, none adjacent: one advice per row
    np.testing.assert_array_equal(mapped.take_rows(memory_map, rows), images[rows])
    assert len(advice) == 32
    # Block k is copied once block k + 1 has been advised: 6 advices before the first copy.
    assert copied == [min(32, 3 * (k + 2)) for k in range(11)]


def test_arrays_in_memory_get_no_advice_any_map_of_the_file_does(on_disk, advice, tmp_path):
    images, _ = on_disk
    mapped.take_rows(images, [1, 2])
    private = np.load(tmp_path / "images.npy", mmap_mode="c")
    np.testing.assert_array_equal(mapped.take_rows(private, [1, 2]), images[[1, 2]])
    assert len(advice) == 1  # the copy-on-write map reads the file's pages too: advised
    assert not mapped._advisable(np.zeros((4, 3), np.uint8), 3)


def test_sets_read_their_rows_through_the_advice(on_disk, advice):
    """``read_rows`` (the stream's reader, the channel statistics, the checkpoint's digest) and
    ``ImageSet.subset`` read a memory-mapped set's rows with the advice."""
    images, memory_map = on_disk
    data = jf.data.ImageSet(memory_map, np.arange(64) % 2, ("a", "b"))
    np.testing.assert_array_equal(read_rows(data, np.array([4, 8])), images[[4, 8]])
    np.testing.assert_array_equal(data.subset([9, 1]).images, images[[9, 1]])
    np.testing.assert_array_equal(read_rows(memory_map, np.array([2])), images[[2]])
    assert len(advice) == 5
