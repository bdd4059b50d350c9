"""Seconds to a folder's channel statistics: summed from the moments stored with its resize
cache, against a pass over the cached images read from disk (the page cache dropped first).

    python benchmarks/channel_statistics.py FOLDER [--image-size 32] [--rounds 3]

The folder's resize cache is built first if needed (under ``$JAXFLOWERS_CACHE_DIR``). The
statistics of a streamed training set are its set-up's pass over the whole set on disk; for a
set larger than memory the pass reads it from disk once more before training.
"""
import argparse
import os
import time

import numpy as np

import jaxflowers as jf
from jaxflowers.data.moments import channel_stats


class WithoutStored:
    """The folder as a set whose cache stores nothing per image (no moments, no digests):
    what needs them reads its images."""

    def __init__(self, folder):
        self.folder, self.labels = folder, folder.labels

    def __len__(self):
        return len(self.folder)

    @property
    def image_shape(self):
        return self.folder.image_shape

    def read(self, index):
        return self.folder.read(index)


def drop_pages(path: str) -> None:
    """The file's pages out of memory: the whole page cache as root, else the file's own
    (``posix_fadvise``, which leaves the pages a process has mapped)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return
    except OSError:
        pass
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = jf.data.ImageFolder(args.folder, image_size=args.image_size)
    path = folder.cache_path
    if folder.row_moments() is None:
        raise SystemExit(f"{path} holds no moments (built by an older jaxflowers?): delete it "
                         "and run again")
    size = os.path.getsize(path) / 1e9
    print(f"{len(folder)} images, cache {path} ({size:.2f} GB)")
    results = {"moments": [], "pass": []}
    for _ in range(args.rounds):
        for name, data in (("moments", folder), ("pass", WithoutStored(folder))):
            drop_pages(path)
            start = time.perf_counter()
            mean, std = channel_stats(data)
            results[name].append(time.perf_counter() - start)
            found = (mean, std)
            if name == "moments":
                expected = found
            else:
                assert all(np.array_equal(a, b) for a, b in zip(found, expected))
    for name, times in results.items():
        print(f"{name:8s} {np.median(times):7.3f} s (median of {len(times)}: "
              + ", ".join(f"{t:.3f}" for t in times) + ")")
    print("the same statistics either way")


if __name__ == "__main__":
    main()
