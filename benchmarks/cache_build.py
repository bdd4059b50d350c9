"""How fast ImageFolder builds and reopens its resize cache, and how much memory a build takes.

    python benchmarks/cache_build.py [--data ../shared/data] [--repeats 3] [--json out.json]
    python benchmarks/cache_build.py --files 6000 [--size 32] [--repeats 3] [--json out.json]

1. Flowers sample (200 JPEGs, 143-1024 px wide) resized to 224x224: a cold build into a
   fresh cache folder (median of ``--repeats``; the source JPEGs sit in the OS page cache
   after the first repeat, so this measures decoding, not the disk), as images/s.
2. Reopening the unchanged folder: a new ImageFolder plus ``images`` (this lists the
   folder, hashes the cache file to verify it and maps it; it decodes nothing).
3. Peak resident memory of a fresh process that builds the caches of the CIFAR-10 sample
   (5,000 train + 1,000 test JPEGs at 32x32): ``ru_maxrss`` before and after the builds,
   and tracemalloc's peak of Python and numpy allocations during them.

With ``--files N`` only this runs instead: N synthetic 32x32 PNGs (10 class folders, a
seeded gradient plus noise, like CIFAR-10 photos) written to a temporary folder, then
built into a fresh cache at ``--size`` in threads and in decode processes (median of
``--repeats`` each, alternating), as images/s. The PNGs were just written, so they sit in
the OS page cache: this measures decoding and writing, not the disk.
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

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from jaxflowers.data import cache as cache_lib  # noqa: E402
from jaxflowers.data import decode  # noqa: E402
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


def _write_pngs(root: pathlib.Path, count: int) -> list[str]:
    """``count`` 32x32 RGB PNGs in 10 class folders; their paths in row order."""
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 160, 32)[None, :, None] + np.linspace(0, 60, 3)
    paths = []
    for i in range(count):
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.clip(ramp + rng.normal(0, 25, (32, 32, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:06d}.png")
        paths.append(str(folder / f"{i:06d}.png"))
    return paths


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def synthetic(count: int, size: int, repeats: int) -> dict:
    """Cold builds of ``count`` synthetic PNGs in threads and in processes, median seconds."""
    seconds: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        files = _write_pngs(pathlib.Path(tmp) / "pngs", count)
        for repeat in range(repeats):
            for processes in (False, True):
                start = time.perf_counter()
                cache_lib.open_or_build(files, [""] * count, _read, image_size=(size, size),
                                        cache_dir=f"{tmp}/cache-{processes}-{repeat}",
                                        processes=processes)
                seconds[processes].append(time.perf_counter() - start)
    out = {"files": count, "image_size": size, "threads": decode.default_workers(),
           "processes": min(decode.default_processes(), count),
           "auto_uses_processes": decode.use_processes(count)}
    for processes, name in ((False, "threads"), (True, "processes")):
        median = statistics.median(seconds[processes])
        out[f"{name}_build_s"], out[f"{name}_images_per_s"] = median, count / median
        out[f"{name}_build_s_all"] = seconds[processes]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=pathlib.Path, help="write the raw numbers here")
    parser.add_argument("--files", type=int, help="time threads against processes on this "
                        "many synthetic PNGs (and nothing else)")
    parser.add_argument("--size", type=int, default=32, help="cache image size for --files")
    parser.add_argument("--cifar-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cifar_child:
        print(json.dumps(cifar_child(args.data.resolve())))
        return
    if args.files:
        _report_synthetic(synthetic(args.files, args.size, args.repeats), args)
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


def _report_synthetic(result: dict, args) -> None:
    result = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "available_cpus": decode.available_cpus(), **result}
    print(f"{result['cpus']} CPUs ({result['machine']}), {result['available_cpus']} available")
    for name in ("threads", "processes"):
        print(f"{result['files']} synthetic 32x32 PNGs -> {args.size}x{args.size}, "
              f"{result[name]} {name}: build {result[f'{name}_build_s']:.2f} s "
              f"({result[f'{name}_images_per_s']:.0f} images/s, median of {args.repeats})")
    print(f"speed-up of processes over threads: "
          f"{result['threads_build_s'] / result['processes_build_s']:.2f}x; a build of this "
          f"many local files uses {'processes' if result['auto_uses_processes'] else 'threads'}"
          " by default here")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
