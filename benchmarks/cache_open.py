"""What a training set on disk costs a run before its first step, with the resize cache's pages
dropped from memory before each: opening the cache, trusted by the stamp of its last check
against its digest read in full (``fingerprint="content"``); and a checkpointed run's data
digest, from the per-image digests stored with the cache against a pass over its images.

    python benchmarks/cache_open.py FOLDER [--image-size 224] [--rounds 3]

The folder's resize cache is built first if needed (under ``$JAXFLOWERS_CACHE_DIR``). Only the
cache's check is timed (the folder is listed once, before), with the first 128 rows read after
it as a training's first batch would be.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import jaxflowers as jf
from jaxflowers.data import cache as cache_lib
from jaxflowers.data import digests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under safe-path
from channel_statistics import WithoutStored, drop_pages  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the times here")
    args = parser.parse_args()
    size = (args.image_size, args.image_size)
    folder = jf.data.ImageFolder(args.folder, image_size=size)
    path = folder.cache_path  # built (or checked) here, before the timed opens
    source = folder._source  # the listing the folder made, and what reads its files
    scan = source.scan
    print(f"{len(scan.files)} images, cache {path} ({os.path.getsize(path) / 1e9:.2f} GB)")
    times = {"stamp": [], "digest": [], "set digest, stored": [], "set digest, pass": []}
    opens = ("stamp", "digest")
    for _ in range(args.rounds):
        for how in opens:
            drop_pages(path)
            start = time.perf_counter()
            cache = cache_lib.open_or_build(
                scan.files, scan.fingerprints, source.source.read, image_size=size,
                name=source.source.name, origin=source.root, verify=how == "digest")
            np.asarray(cache.images[:128]).sum()  # a first batch
            times[how].append(time.perf_counter() - start)
            assert cache.path == path, "the timed open rebuilt the cache"
        found = []
        for how, digest in (("set digest, stored", digests.set_digest),
                            ("set digest, pass", lambda f: digests.set_digest(WithoutStored(f)))):
            drop_pages(path)
            start = time.perf_counter()
            found.append(digest(folder))
            times[how].append(time.perf_counter() - start)
        assert found[0] == found[1], found
    for how, values in times.items():
        print(f"{how:18s} {np.median(values):7.3f} s (median of {len(values)}: "
              + ", ".join(f"{t:.3f}" for t in values) + ")")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"images": len(scan.files), "bytes": os.path.getsize(path),
                       "seconds": times}, f, indent=1)


if __name__ == "__main__":
    main()
