"""How fast ImageFolder builds and reopens its resize cache, and how much memory a build takes.

    python benchmarks/cache_build.py [--data ../shared/data] [--repeats 3] [--json out.json]

1. Flowers sample (200 JPEGs, 143-1024 px wide) resized to 224x224: a cold build into a
   fresh cache folder (median of ``--repeats``; the source JPEGs sit in the OS page cache
   after the first repeat, so this measures decoding, not the disk), as images/s.
2. Reopening the unchanged folder: a new ImageFolder plus ``images`` (this lists the
   folder, hashes the cache file to verify it and maps it; it decodes nothing).
3. Peak resident memory of a fresh process that builds the caches of the CIFAR-10 sample
   (5,000 train + 1,000 test JPEGs at 32x32): ``ru_maxrss`` before and after the builds,
   and tracemalloc's peak of Python and numpy allocations during them.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from jaxflowers.data.folder import ImageFolder  # noqa: E402

DEFAULT_DATA = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def _build_seconds(root: pathlib.Path, image_size, cache_dir: str) -> tuple[float, int]:
    start = time.perf_counter()
    ds = ImageFolder(root, image_size=image_size, cache_dir=cache_dir)
    n = len(ds.images)  # the first access decodes everything into the cache
    return time.perf_counter() - start, n


def flowers(data: pathlib.Path, repeats: int) -> dict:
    """Cold build and warm reopen times of the flowers sample at 224x224."""
    root = data / "flowers-sample"
    builds, reopens = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache_dir:
            seconds, n = _build_seconds(root, (224, 224), cache_dir)
            builds.append(seconds)
            reopens.append(min(_build_seconds(root, (224, 224), cache_dir)[0]
                               for _ in range(repeats)))
    build = statistics.median(builds)
    return {"images": n, "build_s": build, "images_per_s": n / build,
            "reopen_s": statistics.median(reopens), "build_s_all": builds}


def _build_cifar(data: pathlib.Path) -> tuple[float, int]:
    n, start = 0, time.perf_counter()
    with tempfile.TemporaryDirectory() as cache_dir:
        for part in ("train", "test"):
            n += len(ImageFolder(data / "cifar10-small" / part, image_size=(32, 32),
                                 cache_dir=cache_dir).images)
    return time.perf_counter() - start, n


def cifar_child(data: pathlib.Path) -> dict:
    """In a fresh process: time and peak memory of building the CIFAR sample's two caches.

    The timed build runs without tracemalloc (which slows every allocation); a second build
    into a fresh folder measures tracemalloc's peak.
    """
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds, n = _build_cifar(data)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    _build_cifar(data)
    _, traced_peak = tracemalloc.get_traced_memory()
    return {"images": n, "build_s": seconds, "images_per_s": n / seconds,
            "maxrss_before_mib": rss_before / 1024, "maxrss_after_mib": rss_after / 1024,
            "tracemalloc_peak_mib": traced_peak / 2**20}


def cifar(data: pathlib.Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--data", str(data), "--cifar-child"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=pathlib.Path, help="write the raw numbers here")
    parser.add_argument("--cifar-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cifar_child:
        print(json.dumps(cifar_child(args.data.resolve())))
        return
    data = args.data.resolve()
    result = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "flowers_224": flowers(data, args.repeats), "cifar_32": cifar(data)}
    f, c = result["flowers_224"], result["cifar_32"]
    print(f"{result['cpus']} CPUs ({result['machine']})")
    print(f"flowers-sample, 200 JPEGs -> 224x224: build {f['build_s']:.2f} s "
          f"({f['images_per_s']:.0f} images/s, median of {args.repeats}); "
          f"second (cached) run {f['reopen_s'] * 1e3:.1f} ms")
    print(f"cifar10-small, {c['images']} JPEGs -> 32x32: build {c['build_s']:.2f} s "
          f"({c['images_per_s']:.0f} images/s); peak RSS {c['maxrss_after_mib']:.0f} MiB "
          f"(after imports {c['maxrss_before_mib']:.0f} MiB); "
          f"tracemalloc peak {c['tracemalloc_peak_mib']:.1f} MiB")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
