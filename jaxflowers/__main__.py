"""Command line: ``python -m jaxflowers {train, download, sweep}``.

``python -m jaxflowers train`` with no arguments trains ``cifar_net(depth=2)`` on the
embedded handwritten digits (offline), 90/10 stratified split, on every local device, and
prints the test accuracy.
"""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jaxflowers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a network and report test accuracy")
    train.add_argument("--recipe", default=None, metavar="NAME",
                       help="flowers (MATLAB's multi-GPU example, verbatim), flowers-tuned, "
                            "sweep (MATLAB's parfeval example) or digits; default: flowers for "
                            "flowers or resnet50, digits otherwise (jaxflowers.recipes.RECIPES)")
    train.add_argument("--data", default=None,
                       help="digits, flowers, cifar10, a folder or a URL (default: the "
                            "recipe's; digits without a recipe)")
    train.add_argument("--model", choices=("cifar_net", "resnet50"), default=None,
                       help="default: the recipe's (resnet50 for flowers, cifar_net otherwise)")
    train.add_argument("--depth", type=int, default=2, help="cifar_net depth (default 2)")
    train.add_argument("--epochs", type=int, default=None)
    train.add_argument("--batch-size", type=int, default=None,
                       help="global mini-batch (flowers: per device, scaled by --devices)")
    train.add_argument("--devices", type=int, default=None, help="use only N local devices")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--strategy", choices=("shard_map", "pmap"), default="shard_map")
    train.add_argument("--quiet", action="store_true", help="no progress table")
    _distributed_arguments(train)
    _sweep_parser(commands)
    download = commands.add_parser("download", help="download a data set")
    download.add_argument("name", choices=("flowers",))
    download.add_argument("dest")
    return parser


def _distributed_arguments(train) -> None:
    group = train.add_argument_group(
        "several processes (hosts)", "join a multi-process training through "
        "jax.distributed; every process runs the same command. Under Slurm, Open MPI or "
        "Kubernetes --distributed alone suffices; else give all three of the next flags (or "
        "$JAXFLOWERS_COORDINATOR, $JAXFLOWERS_NUM_PROCESSES, $JAXFLOWERS_PROCESS_ID)")
    group.add_argument("--distributed", action="store_true",
                       help="initialise jax.distributed from the cluster's environment")
    group.add_argument("--coordinator", metavar="HOST:PORT",
                       help="address of process 0, reachable from every host")
    group.add_argument("--num-processes", type=int, metavar="N", help="processes in all")
    group.add_argument("--process-id", type=int, metavar="I", help="this process, 0..N-1")


def _sweep_parser(commands) -> None:
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


def _sweep(args) -> int:
    import json

    from jaxflowers.sweep.example import DataUnavailableError, run_sweep  # imports no JAX

    overrides = {}
    for item in args.option:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--option {item!r}: use NAME=VALUE")
        try:
            overrides[name] = json.loads(value)
        except json.JSONDecodeError:
            overrides[name] = value  # a bare string such as sgdm
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


def _join_processes(args) -> None:
    """Start jax.distributed when asked to; first, before anything starts JAX's backends."""
    if args.distributed or any(v is not None for v in (args.coordinator, args.num_processes,
                                                       args.process_id)):
        from jaxflowers import parallel
        parallel.initialize(args.coordinator, args.num_processes, args.process_id)


def _train(args) -> int:
    import time

    clock = [time.perf_counter()]  # start, JAX ready, data ready, trained, predicted
    _join_processes(args)
    import jax

    import jaxflowers as jf
    from jaxflowers import recipes

    jf.enable_compilation_cache()  # a second run loads its compiled programs
    from jaxflowers.parallel import select_devices

    recipe = (recipes.recipe(args.recipe) if args.recipe  # a bad name fails before JAX starts
              else recipes.recipe_for(args.data or "digits", args.model))
    devices = select_devices("auto", args.devices)  # starts the backend
    clock.append(time.perf_counter())
    model_name = args.model or recipe.model
    data = recipes.load_data(args.data or recipe.data, model=model_name)
    train_set, test_set = data.split_each_label(recipe.train_fraction, seed=args.seed)
    model = recipes.build_model(model_name, len(data.class_names), depth=args.depth)
    common = dict(validation_data=test_set, seed=args.seed, verbose=not args.quiet)
    if args.epochs:
        common["max_epochs"] = args.epochs
    opts = recipe.options(len(devices), len(train_set), batch_size=args.batch_size, **common)
    clock.append(time.perf_counter())
    execution = jf.ExecutionOptions(num_devices=args.devices, strategy=args.strategy)
    net, info = jf.train(train_set, model, opts, execution=execution)
    clock.append(time.perf_counter())
    predicted = jf.scores_to_labels(jf.predict(net, test_set, num_devices=args.devices),
                                    net.class_names)
    clock.append(time.perf_counter())
    accuracy = jf.accuracy(predicted, test_set.labels)
    if jax.process_index() != 0:
        return 0  # every process has the same results; process 0 reports them
    print(f"Compile {info.compile_time:.1f} s, training {info.train_time:.1f} s "
          f"({info.images_per_second:,.0f} images/s on {info.num_devices} device(s))")
    start_up, load, trained, predict = (b - a for a, b in zip(clock[:-1], clock[1:]))
    print(f"Seconds: JAX start-up {start_up:.1f}, data {load:.1f}, placing and "
          f"initialising {trained - info.compile_time - info.train_time:.1f}, compile "
          f"{info.compile_time:.1f}, training {info.train_time:.1f}, prediction {predict:.1f}")
    print(f"Test accuracy: {100 * accuracy:.2f}% ({len(test_set)} images)")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "train":
        return _train(args)
    if args.command == "sweep":
        return _sweep(args)
    if args.command == "download":
        from jaxflowers.data import download_flowers
        print(download_flowers(args.dest))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
