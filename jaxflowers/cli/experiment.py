"""``python -m jaxflowers sweep --param ...``: an experiment from the shell.

``jaxflowers.cli.sweep`` adds these flags to its subcommand and hands the parsed arguments
here when a ``--param`` is given. Nothing here imports JAX.
"""
from __future__ import annotations

import argparse
import os
import sys

from jaxflowers.cli.args import positive_float, positive_int
from jaxflowers.cli.outputs import RUNS

__all__ = ["add_arguments", "run"]


def add_arguments(sweep: argparse.ArgumentParser) -> None:
    """Add the experiment's flags to the ``sweep`` subcommand's parser."""
    group = sweep.add_argument_group(
        "experiments", "vary any parameter (Experiment Manager); rerunning the same command "
        "resumes, running only the trials that have not finished")
    group.add_argument("--param", action="append", default=[], metavar="NAME=VALUES",
                       help="a parameter to vary: NAME=V1,V2,... or NAME=KIND:LOW:HIGH with "
                            "KIND uniform, loguniform, int or logint; NAME is a TrainingOptions "
                            "or ExecutionOptions field, a network argument (depth, width), "
                            "model or data; repeatable (default: none, the depth sweep)")
    group.add_argument("--strategy", default="grid",
                       help="grid (every combination; default), random, or bayesian (TPE)")
    group.add_argument("--trials", type=positive_int, default=None,
                       help="number of trials (random and bayesian need it; a grid's default "
                            "is every combination)")
    group.add_argument("--objective", default="validation_accuracy",
                       help="what the search optimises: validation_accuracy (default), "
                            "validation_loss or validation_<metric>")
    group.add_argument("--pruner", default="none",
                       help="stop trials that fall behind at equal iterations: median, "
                            "halving (successive halving), or none (default)")
    group.add_argument("--recipe", default="sweep",
                       help="the options every trial starts from (default: sweep, the "
                            "parfeval example's)")
    group.add_argument("--name", default="experiment",
                       help="the experiment's name in its storage (default: experiment)")
    group.add_argument("--storage", default=None,
                       help="an SQLAlchemy URL or file for the trials (default: "
                            "OUT/experiment.db, SQLite); a shared server lets several "
                            "machines run one experiment")
    group.add_argument("--timeout", type=positive_float, default=None,
                       help="seconds a trial may run before it is failed (default: none)")


def run(args: argparse.Namespace, options: dict) -> int:
    """Run the experiment ``args`` describe, with the ``--option`` settings ``options``;
    returns the exit status (0: a trial finished, 1: none did, 2: bad input, 130:
    interrupted)."""
    from jaxflowers.recipes import DataUnavailableError
    from jaxflowers.sweep.experiment import Experiment, parse

    if args.depths is not None:
        return _error("--depths is the example's shorthand; with --param, vary the depth "
                      "as --param depth=1,2,3,4")
    if args.epochs is not None:
        options = {**options, "max_epochs": args.epochs}
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    try:
        params = dict(parse(item) for item in args.param)
        experiment = Experiment(recipe=args.recipe, params=params, strategy=args.strategy,
                                trials=args.trials, objective=args.objective,
                                data=args.data, options=options, pruner=args.pruner,
                                seed=args.seed, name=args.name,
                                out_dir=args.out or os.path.join(RUNS, args.name),
                                storage=args.storage, timeout=args.timeout)
        result = experiment.run(devices=devices, jobs_per_device=args.jobs_per_device)
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    except (DataUnavailableError, ValueError, TypeError, OSError) as error:
        return _error(str(error))
    print(f"Wall time: {result.wall_time:.1f} s")
    if result.interrupted:
        return 130
    return 0 if result.best is not None else 1


def _error(text: str) -> int:
    print(f"error: {text.splitlines()[0] if text else 'failed'}", file=sys.stderr)
    return 2
