"""Issue 2's figure: images/s of ``jaxflowers.train`` on 1 and N devices.

    python benchmarks/train_throughput.py [--devices 1 8] [--out runs/train_throughput.json]

ResNet-50 at 224x224 (5 classes, 3,670 synthetic images resident on the devices, random
mirror and +-30 px shifts) and ``cifar_net(depth)`` for depth 1-4 at 32x32 (10 classes,
45,000 synthetic images, mirror and +-4 px shifts), weak scaling (per-device batch kept,
``scale_for_devices``) with shard_map unless told otherwise. Everything is measured by
``jaxflowers.bench`` (see its docstring for the timing: compile apart, synchronised
windows after a warm-up, median); this script only picks the configurations. Writes the
JSON to ``--out`` and the speedup figure beside it (same name, .png); the table is
printed last.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from jaxflowers import bench  # noqa: E402
from jaxflowers.options.execution import PRECISIONS, STRATEGIES  # noqa: E402

MODELS = ("resnet50", "cifar_net:1", "cifar_net:2", "cifar_net:3", "cifar_net:4")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", nargs="+", type=int, help="default: 1 and every local device")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--strategies", nargs="+", default=["shard_map"], choices=STRATEGIES)
    p.add_argument("--scalings", nargs="+", default=["weak"], choices=bench.SCALINGS)
    p.add_argument("--per-device-batch", type=int, help="default: 64 resnet50, 128 cifar_net")
    p.add_argument("--precision", default="auto", choices=PRECISIONS)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--window-steps", type=int, help="default: 20 resnet50, 256 cifar_net")
    p.add_argument("--num-images", type=int, help="default: 3,670 resnet50, 45,000 cifar_net")
    p.add_argument("--out", default="runs/train_throughput.json")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    devices = tuple(args.devices) if args.devices else (1, jax.local_device_count())
    settings = bench.BenchSettings(
        models=tuple(args.models), devices=devices, strategies=tuple(args.strategies),
        scalings=tuple(args.scalings), per_device_batch=args.per_device_batch,
        precision=args.precision, windows=args.windows, window_steps=args.window_steps,
        num_images=args.num_images)
    report = bench.run(settings)
    path = bench.save(report, args.out)
    bench.draw(path, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    if report["environment"]["fake_cpu_devices"]:
        print(bench.CPU_NOTE)
    print("\n".join(bench.table_lines(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
