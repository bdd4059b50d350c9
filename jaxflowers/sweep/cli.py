"""``python -m jaxflowers sweep``: MATLAB's parfeval example from the shell.

``jaxflowers.__main__`` adds this subcommand with :func:`add_parser` and hands the parsed
arguments to :func:`run`. Nothing here imports JAX: the workers own the devices.
"""
from __future__ import annotations

import argparse
import json
import sys


def add_parser(commands) -> argparse.ArgumentParser:
    """Add the ``sweep`` subcommand to ``commands`` (an argparse subparsers object)."""
    sweep = commands.add_parser(
        "sweep", help="train cifar_net of several depths side by side (MATLAB's parfeval "
                      "example), test the best")
    sweep.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 4])
    sweep.add_argument("--data", default="cifar10",
                       help="cifar10 (TFDS, prepared; default), digits (embedded, offline), or "
                            "a folder of class folders (or of train/ and test/)")
    sweep.add_argument("--epochs", type=int, default=30)
    sweep.add_argument("--devices", default="all", help="all (default) or a number of GPUs "
                                                         "(CPU slots without GPUs)")
    sweep.add_argument("--jobs-per-device", type=int, default=1)
    sweep.add_argument("--out", default=".", help="folder for the PNGs and job logs")
    sweep.add_argument("--seed", type=int, default=0)
    sweep.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                       help="set a TrainingOptions field in every job (JSON value), "
                            "e.g. --option steps_per_dispatch=1")
    return sweep


def parse_options(items: list[str]) -> dict:
    """``--option NAME=VALUE`` items as a dict; a value that is not JSON stays a string."""
    overrides = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--option {item!r}: use NAME=VALUE")
        try:
            overrides[name] = json.loads(value)
        except json.JSONDecodeError:
            overrides[name] = value  # a bare string such as sgdm
    return overrides


def run(args: argparse.Namespace) -> int:
    """Run the sweep the parsed ``args`` describe; returns the exit status."""
    from jaxflowers.sweep.example import DataUnavailableError, run_sweep  # imports no JAX

    overrides = parse_options(args.option)
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    try:
        result = run_sweep(args.depths, data=args.data, epochs=args.epochs, devices=devices,
                           jobs_per_device=args.jobs_per_device, out_dir=args.out,
                           seed=args.seed, options_overrides=overrides)
    except DataUnavailableError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"Wall time: {result.wall_time:.1f} s")
    return 0 if result.best_depth is not None else 1
