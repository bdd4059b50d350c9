"""``python -m jaxflowers sweep``: MATLAB's parfeval example from the shell, or with
``--param`` an experiment over any parameter (``jaxflowers.cli.experiment``). Imports no
JAX: the workers own the devices."""
from __future__ import annotations

import argparse
import json
import os
import sys

from jaxflowers.cli import experiment as experiment_cli
from jaxflowers.cli.args import non_negative_int, positive_int, positive_int_or_auto
from jaxflowers.cli.outputs import RUNS, RunOutputs
from jaxflowers.host import signals

__all__ = ["add_parser", "command_line_fields", "parse_options", "run"]


def add_parser(commands, parents=()) -> argparse.ArgumentParser:
    """Add the ``sweep`` subcommand to ``commands`` (argparse subparsers), with ``parents``."""
    sweep = commands.add_parser(
        "sweep", parents=list(parents),
        help="train cifar_net of several depths side by side (MATLAB's parfeval example), "
             "or run an experiment over any parameter (--param), test the best")
    sweep.add_argument("--depths", type=positive_int, nargs="+", default=None,
                       metavar="D", help="one job per cifar_net depth (default: 1 2 3 4)")
    sweep.add_argument("--data", default="digits",
                       help="digits (embedded in scikit-learn, offline; default), cifar10 "
                            "(TFDS, prepared beforehand), or a folder of class folders (or "
                            "of train/ and test/)")
    sweep.add_argument("--epochs", type=positive_int, default=None,
                       help="training epochs per job (default: 30; an experiment: the "
                            "recipe's)")
    sweep.add_argument("--devices", default="all",
                       help="all (default) or a number of GPUs (CPU slots without GPUs)")
    sweep.add_argument("--jobs-per-device", type=positive_int_or_auto, default=1,
                       metavar="N|auto",
                       help="jobs sharing each GPU; auto: as many as the first job's measured "
                            "memory lets fit, up to 8 (default: 1)")
    sweep.add_argument("--mps", choices=("auto", "on", "off"), default="auto",
                       help="jobs sharing a GPU run at the same time under NVIDIA's MPS, "
                            "started and stopped by the sweep: auto (when MPS can start; "
                            "else they take turns, with a warning), on (fail if it cannot), "
                            "off (default: auto)")
    sweep.add_argument("--out", default=None, metavar="DIR",
                       help="the run folder: sweep_results.json, the metrics CSVs, "
                            "sweep_progress.png (rewritten at each validation), "
                            "confusion_best.png and the job logs (default: a new folder "
                            f"{RUNS}/<date>_<time>-sweep; an experiment: {RUNS}/NAME, where "
                            "the same command resumes it)")
    sweep.add_argument("--seed", type=non_negative_int, default=0,
                       help="data splits, initialisation, shuffling (default: 0)")
    sweep.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                       help="set a TrainingOptions (or ExecutionOptions) field in every job "
                            "(JSON value), e.g. --option steps_per_dispatch=1; repeatable "
                            "(default: the parfeval example's options)")
    experiment_cli.add_arguments(sweep)
    return sweep


# Fields a command line cannot give: data sets and functions are no JSON values, and the
# sweep sets these itself (--epochs, --seed; workers draw no plots, the pool does).
_NOT_ON_A_COMMAND_LINE = {"validation_data": "the sweep holds out 10% of --data",
                          "output_fn": "the pool receives every job's messages",
                          "max_epochs": "use --epochs", "seed": "use --seed",
                          "plots": "the sweep draws sweep_progress.png itself",
                          "plots_path": "the sweep draws sweep_progress.png itself"}


def command_line_fields() -> list[str]:
    """The ``TrainingOptions`` and ``ExecutionOptions`` fields ``--option`` can set."""
    import dataclasses

    from jaxflowers.options import ExecutionOptions, TrainingOptions

    names = [f.name for cls in (TrainingOptions, ExecutionOptions)
             for f in dataclasses.fields(cls) if f.init]
    return [name for name in names if name not in _NOT_ON_A_COMMAND_LINE]


def parse_options(items: list[str]) -> dict:
    """``--option NAME=VALUE`` items as a dict (a value that is not JSON stays a string);
    ValueError for an item without ``=`` or a name a command line cannot set."""
    overrides, allowed = {}, command_line_fields()
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"{item!r}: use NAME=VALUE")
        if name in _NOT_ON_A_COMMAND_LINE:
            raise ValueError(f"{name} cannot be set on the command line: "
                             f"{_NOT_ON_A_COMMAND_LINE[name]}")
        if name not in allowed:
            raise ValueError(f"unknown option {name!r}; the command line can set "
                             f"{', '.join(allowed)}")
        try:
            overrides[name] = json.loads(value)
        except json.JSONDecodeError:
            overrides[name] = value  # a bare string such as sgdm
    return overrides


def run(args: argparse.Namespace) -> int:
    """Run the sweep the parsed ``args`` describe; returns the exit status (0: a best
    network was found, 1: every job failed, 2: bad input, 130: Ctrl-C, 143: SIGTERM)."""
    from jaxflowers.host.mps import MpsError
    from jaxflowers.recipes import DataUnavailableError
    from jaxflowers.sweep.example.run import run_sweep  # imports no JAX
    from jaxflowers.sweep.jobs import job_options

    devices = int(args.devices) if args.devices.isdigit() else args.devices
    try:
        overrides = parse_options(args.option)
        job_options(overrides)  # before any worker starts
    except (ValueError, TypeError) as error:
        return _error(f"--option: {error}")
    if args.param:
        return experiment_cli.run(args, overrides)
    outputs = RunOutputs(args.out, None, suffix="-sweep")
    try:
        outputs.check()
        print(f"Run folder: {outputs.create()}", flush=True)
    except OSError as error:
        return _error(str(error))
    os.environ.setdefault("MPLBACKEND", "Agg")  # figures as files; a window only when asked
    try:
        result = run_sweep(args.depths or [1, 2, 3, 4], data=args.data,
                           epochs=args.epochs or 30, devices=devices,
                           jobs_per_device=args.jobs_per_device,
                           mps={"auto": "auto", "on": True, "off": False}[args.mps],
                           out_dir=outputs.folder,
                           seed=args.seed, options_overrides=overrides)
    except KeyboardInterrupt as stop:  # before any job started
        print(f"{signals.signal_words(stop, capital=True)}.", file=sys.stderr)
        return signals.exit_status(stop)
    except (DataUnavailableError, ValueError, OSError, MpsError) as error:
        return _error(str(error))
    finally:
        outputs.discard_if_empty()
    print(f"Wall time: {result.wall_time:.1f} s")
    if result.interrupted:
        return 143 if result.interrupted == "SIGTERM" else 130
    return 0 if result.best_depth is not None else 1


def _error(text: str) -> int:
    print(f"error: {text.splitlines()[0] if text else 'failed'}", file=sys.stderr)
    return 2
