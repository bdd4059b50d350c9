"""``python -m jaxflowers train``: its flags and what it runs.

Trains the recipe's network, tests it on the held-out images and keeps in one run folder
what the MATLAB example shows (the training-progress figure, the test set's confusion chart)
with the metrics and what was asked for (``--save``); Ctrl-C becomes one line
(:class:`Interrupted`)."""
from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import time

from jaxflowers.cli.args import image_size, non_negative_int, number, positive_float, positive_int
from jaxflowers.cli.outputs import RUNS, RunOutputs
from jaxflowers.host import signals
from jaxflowers.recipes.networks import IMAGE_SIZE  # imports no JAX

__all__ = ["CONFUSION_CHART", "Diverged", "Interrupted", "METRICS", "TRAINING_PROGRESS",
           "add_parser", "run", "stage"]

METRICS, TRAINING_PROGRESS, CONFUSION_CHART = (
    "metrics.csv", "training_progress.png", "confusion_chart.png")  # in the run folder


class Interrupted(Exception):
    """SIGINT or SIGTERM as one line (what was going on, what was kept) and an exit status."""

    def __init__(self, message: str, status: int = 130):
        super().__init__(message)
        self.status = status


def add_parser(commands, common) -> None:
    """Add the ``train`` subcommand (``common``: the parent parser of shared flags)."""
    train = commands.add_parser("train", parents=[common],
                                help="train a network and report test accuracy")
    train.add_argument("--recipe", default=None, metavar="NAME",
                       help="flowers (MATLAB's multi-GPU example, verbatim), flowers-tuned, "
                            "flowers-pretrained (fine-tuning --weights), sweep (MATLAB's "
                            "parfeval example) or digits (default: flowers-pretrained with "
                            "--weights, flowers for --data flowers or --model resnet50, digits "
                            "otherwise)")
    train.add_argument("--data", default=None, metavar="NAME|DIR|URL",
                       help="digits (embedded, offline), flowers (downloaded once), cifar10 "
                            "(TFDS), a folder of class folders (split per class by the recipe, "
                            "90/10), a folder holding train/ and test/ class folders (trained "
                            "on train/, tested on test/), or an s3:// gs:// https:// URL "
                            "(default: the recipe's data; digits without a recipe)")
    train.add_argument("--model", choices=tuple(IMAGE_SIZE), default=None,
                       help="the network (default: the recipe's: resnet50 for flowers, "
                            "cifar_net otherwise)")
    train.add_argument("--image-size", type=image_size, default=None, metavar="N|HxW",
                       help="pixels every image is resized to (default: the network's: 32 for "
                            "cifar_net, 224 for the ResNets)")
    train.add_argument("--verify-cache", action="store_true",
                       help="read every image file, and the whole resize cache, to check "
                            "that the cache still matches them, for files that may change "
                            "without a new size, mtime, inode or ctime (default: trust that "
                            "metadata)")
    train.add_argument("--validation-split", type=number(0, 1), default=None,
                       metavar="FRACTION",
                       help="share of each class held out to test and validate on when the "
                            "data have no test/ folder (default: the recipe's, 0.1)")
    train.add_argument("--weights", default=None, metavar="PATH",
                       help="start from these torchvision or timm ResNet weights (.safetensors, "
                            "or .pth with torch installed), with a fresh head for the data's "
                            "classes (default: none, a freshly initialised network)")
    train.add_argument("--depth", type=positive_int, default=2, metavar="N",
                       help="cifar_net depth: convolution stages (default: 2)")
    train.add_argument("--epochs", type=positive_int, default=None, metavar="N",
                       help="full passes over the training images (default: the recipe's: "
                            "80 for flowers, 30 for sweep, 15 for digits)")
    train.add_argument("--batch-size", type=positive_int, default=None, metavar="IMAGES",
                       help="MATLAB's MiniBatchSize: images per mini-batch over all devices, "
                            "a multiple of the device count (default: the recipe's; flowers: "
                            "128 x devices)")
    train.add_argument("--learn-rate", type=positive_float, default=None, metavar="RATE",
                       help="initial learning rate, used as given (default: the recipe's; "
                            "flowers: 1e-2 x batch / 64)")
    train.add_argument("--seed", type=non_negative_int, default=0, metavar="N",
                       help="seed of the split, initial weights, shuffle and augmentation "
                            "(default: 0)")
    train.add_argument("--quiet", action="store_true",
                       help="no progress table or bar (default: a row per 50 iterations and "
                            "validation, and on a terminal a bar with the time left)")
    _execution_arguments(train)
    _output_arguments(train)
    _distributed_arguments(train)


def _execution_arguments(train) -> None:
    group = train.add_argument_group("devices", "where and how the training runs")
    group.add_argument("--devices", type=positive_int, default=None, metavar="N",
                       help="use the first N local devices (default: all)")
    group.add_argument("--strategy", choices=("shard_map", "pmap"), default="shard_map",
                       help="how the step is mapped over the devices (default: shard_map)")


def _output_arguments(train) -> None:
    group = train.add_argument_group("outputs", "what the run keeps on disk, all in its run "
                                     "folder")
    group.add_argument("--out", default=None, metavar="DIR",
                       help=f"the run folder: {METRICS} (the per-iteration history), "
                            f"{TRAINING_PROGRESS} (rewritten at each validation), "
                            f"{CONFUSION_CHART} (the test set) and --save's network (default: "
                            f"a new folder {RUNS}/<date>_<time>)")
    group.add_argument("--save", default=None, metavar="FILE",
                       help="save the trained network to FILE, a bare name in the run folder, "
                            "a path with a folder (./net.zip) where it says; "
                            "jaxflowers.load(FILE) reads it back (default: not saved)")
    group.add_argument("--plots", choices=("training-progress", "none"),
                       default="training-progress",
                       help="MATLAB's Plots: the training-progress figure and the confusion "
                            "chart as PNGs, or none (default: training-progress; "
                            "MPLBACKEND=TkAgg or QtAgg also opens a window)")
    group.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                       help="write checkpoints to DIR while training, and on Ctrl-C (default: "
                            "none)")
    group.add_argument("--checkpoint-frequency", type=positive_int, default=1, metavar="N",
                       help="checkpoint every N epochs or iterations (default: 1)")
    group.add_argument("--checkpoint-frequency-unit", choices=("epoch", "iteration"),
                       default="epoch", help="what --checkpoint-frequency counts (default: epoch)")
    group.add_argument("--checkpoint-failure", choices=("warn", "stop"), default="warn",
                       help="a checkpoint that cannot be written (disk full, read-only): warn "
                            "and train on, or stop and keep the results (default: warn)")
    group.add_argument("--resume", action="store_true",
                       help="continue the run checkpointed in --checkpoint-dir (default: start "
                            "afresh)")


def _distributed_arguments(train) -> None:
    group = train.add_argument_group(
        "several processes (hosts)", "join a multi-process training through "
        "jax.distributed; every process runs the same command. Under Slurm, Open MPI or "
        "Kubernetes --distributed alone suffices; else give all three of the next flags (or "
        "$JAXFLOWERS_COORDINATOR, $JAXFLOWERS_NUM_PROCESSES, $JAXFLOWERS_PROCESS_ID)")
    group.add_argument("--distributed", action="store_true",
                       help="initialise jax.distributed from the cluster's environment "
                            "(default: off, one process)")
    group.add_argument("--coordinator", metavar="HOST:PORT",
                       help="address of process 0, reachable from every host (default: none)")
    group.add_argument("--num-processes", type=positive_int, metavar="N",
                       help="processes in all (default: none)")
    group.add_argument("--process-id", type=non_negative_int, metavar="I",
                       help="this process, 0..N-1 (default: none)")
    group.add_argument("--init-timeout", type=positive_float, default=120.0,
                       metavar="SECONDS",
                       help="how long every process waits for all the others to join; then "
                            "the missing ones are named (default: 120)")


def _join_processes(args) -> None:
    """Start jax.distributed when asked to; first, before anything starts JAX's backends."""
    if args.distributed or any(v is not None for v in (args.coordinator, args.num_processes,
                                                       args.process_id)):
        from jaxflowers.distributed import join as distributed
        try:
            distributed.initialize(args.coordinator, args.num_processes, args.process_id,
                                   initialization_timeout=args.init_timeout)
        except (ValueError, distributed.DistributedError) as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2) from None


@contextlib.contextmanager
def stage(what: str, kept: tuple[str, ...] = ()):
    """SIGINT or SIGTERM inside the block becomes :class:`Interrupted` saying ``what`` ran."""
    try:
        yield
    except KeyboardInterrupt as stop:
        saved = f"kept {', '.join(kept)}" if kept else "nothing was saved"
        raise Interrupted(f"{signals.signal_words(stop)} while {what}; {saved}",
                          signals.exit_status(stop)) from None


def run(args) -> int:
    """Run ``python -m jaxflowers train`` for parsed ``args``; returns the exit status."""
    clock = [time.perf_counter()]  # start, JAX ready, data ready, trained, predicted
    outputs = RunOutputs(args.out, args.save)
    # before any work: a result that cannot be written would be lost
    outputs.check(**{"--checkpoint-dir": args.checkpoint_dir})
    os.environ.setdefault("MPLBACKEND", "Agg")  # figures as files; a window only when asked
    try:
        return _run(args, outputs, clock)
    finally:
        outputs.discard_if_empty()  # a run that failed before writing anything


def _run(args, outputs: RunOutputs, clock: list[float]) -> int:
    recipe = _chosen_recipe(args)  # a bad name fails before JAX starts
    with stage("starting JAX"):
        devices, main_process = _start(args)
    clock.append(time.perf_counter())
    import jaxflowers as jf

    if main_process:  # the only one that writes
        print(f"Run folder: {outputs.create()}")
    model_name = args.model or recipe.model
    with stage("loading the data"):
        train_set, test_set, described = _load_sets(args, recipe, model_name)
    model, opts = _recipe(args, recipe, model_name, len(devices), train_set, test_set,
                          outputs if main_process else None)
    if main_process:
        print(described)
        print(_options_line(args, recipe, opts, len(devices)))
    clock.append(time.perf_counter())
    with stage("training"):
        net, info = jf.train(train_set, model, opts, execution=_execution(args),
                             **_resume(args))
    clock.append(time.perf_counter())
    kept = _keep(args, outputs, net, info, main_process)
    with stage("testing the network", kept):
        scores = jf.predict(net, test_set, **_execution(args))
    clock.append(time.perf_counter())
    if main_process:
        labels = jf.scores_to_labels(scores, net.class_names)
        _report(info, clock, jf.accuracy(labels, test_set.labels), len(test_set))
        if args.plots != "none":
            kept += _confusion_chart(test_set, labels, outputs.path(CONFUSION_CHART))
        print(f"Saved {', '.join(kept)}")
    return 0


def _start(args) -> tuple[list, bool]:
    """Join the other processes, start the compilation cache and JAX; (devices, is process 0)."""
    _join_processes(args)
    import jax

    import jaxflowers as jf
    from jaxflowers.parallel.data_parallel import select_devices

    jf.enable_compilation_cache()  # a second run loads its compiled programs
    devices = select_devices("auto", args.devices)  # starts the backend
    return devices, jax.process_index() == 0  # every process has the same results


def _chosen_recipe(args):
    """``--recipe``, or the one ``--data``/``--model`` imply (a bad name fails before loading)."""
    from jaxflowers import recipes

    chosen = (recipes.recipe(args.recipe) if args.recipe else
              recipes.recipe_for(args.data or "digits", args.model, weights=bool(args.weights)))
    if chosen.needs_weights and not args.weights:
        raise ValueError(f"--recipe {chosen.name} fine-tunes pretrained weights: give --weights "
                         "PATH (a torchvision or timm .safetensors or .pth file; README, "
                         "\"Pretrained networks and export\")")
    if args.weights and not os.path.isfile(args.weights):
        raise FileNotFoundError(f"--weights {args.weights}: no such file")
    if args.weights and not (args.model or chosen.model).startswith("resnet"):
        raise ValueError(f"--weights loads ResNet weights; --model {args.model or chosen.model} "
                         "is not a ResNet")
    return chosen


def _load_sets(args, recipe, model_name: str):
    """(training set, test set, one line saying where each comes from) for the flags."""
    from jaxflowers import recipes

    data = args.data if args.data is not None else recipe.data
    if not data:
        raise ValueError("--data is empty; name a data set (digits, flowers, cifar10), a "
                         "folder of class folders or a URL")
    size = args.image_size or recipes.IMAGE_SIZE[model_name]
    fraction = 1.0 - args.validation_split if args.validation_split else recipe.train_fraction
    plan = recipes.data_plan(data, image_size=size, train_fraction=fraction, seed=args.seed,
                             fingerprint="content" if args.verify_cache else "stat")
    train, _, test = recipes.load_plan(plan)
    return train, test, (f"Data: {recipes.describe_plan(plan)}: training on {len(train)}, "
                         f"testing on {len(test)} images of {tuple(size)[0]}x{tuple(size)[1]}")


def _recipe(args, recipe, model_name: str, device_count: int, train_set, test_set,
            outputs: RunOutputs | None):
    """(model, TrainingOptions) of the recipe, with the flags applied; the training-progress
    figure goes into ``outputs``' run folder (None: another process, which draws nothing)."""
    from jaxflowers import recipes

    spec = (model_name, {"depth": args.depth} if model_name == "cifar_net" else {})
    if args.weights:
        spec[1]["weights"] = args.weights
    model = recipes.build_model(spec, len(train_set.class_names))
    common = dict(validation_data=test_set, seed=args.seed, verbose=not args.quiet,
                  **_checkpointing(args))
    if args.plots != "none" and outputs is not None:
        common.update(plots="training-progress",
                      plots_path=str(outputs.path(TRAINING_PROGRESS)))
    if args.epochs:
        common["max_epochs"] = args.epochs
    opts = recipe.options(device_count, len(train_set), batch_size=args.batch_size, **common)
    if args.learn_rate:
        opts = opts.replace(initial_learn_rate=args.learn_rate)
    return model, opts


def _options_line(args, recipe, opts, device_count: int) -> str:
    """The recipe's mini-batch and learning rate, per device, and the rule that made them."""
    batch = opts.mini_batch_size
    rule = "--learn-rate, as given" if args.learn_rate else recipe.scaling
    devices = f"{device_count} device{'s' if device_count > 1 else ''}"
    return (f"Recipe {recipe.name}: mini-batch {batch} ({batch // device_count} per device on "
            f"{devices}), initial learning rate {opts.learn_rate:g} ({rule}), "
            f"{opts.max_epochs} epoch{'s' if opts.max_epochs > 1 else ''}")


def _confusion_chart(test_set, labels, path: pathlib.Path) -> tuple[str, ...]:
    """Save the test set's confusion chart (MATLAB's ``confusionchart``); (the file,) or ()
    with a warning: a figure never costs the results."""
    import warnings

    import matplotlib.pyplot as plt

    from jaxflowers.plots import confusion_chart

    chart = confusion_chart(test_set.labels, labels, labels.class_names)
    try:
        chart.savefig(path, dpi=100)
    except (OSError, ValueError) as error:
        warnings.warn(f"the confusion chart could not be saved to {path}: {error}",
                      stacklevel=2)
        return ()
    finally:
        plt.close(chart.figure)
    return (str(path),)


def _execution(args) -> dict:
    """The ``ExecutionOptions`` fields of the flags (``predict`` takes them too)."""
    return {"num_devices": args.devices, "strategy": args.strategy}


def _checkpointing(args) -> dict:
    if not args.checkpoint_dir:
        return {}
    return {"checkpoint_path": args.checkpoint_dir,
            "checkpoint_frequency": args.checkpoint_frequency,
            "checkpoint_frequency_unit": args.checkpoint_frequency_unit,
            "checkpoint_failure": args.checkpoint_failure}


def _resume(args) -> dict:
    return {"resume": args.checkpoint_dir} if args.resume else {}


def _keep(args, outputs: RunOutputs, net, info, main_process: bool) -> tuple[str, ...]:
    """Write metrics.csv and ``--save`` on process 0 (not after divergence), then raise if training
    did not finish (in every process, so all stop); what was written."""
    from jaxflowers.training.stop import StopReason

    metrics = str(outputs.path(METRICS)) if main_process else METRICS
    kept = (metrics,)
    if main_process:
        info.to_csv(metrics)
        if outputs.save is not None and not info.diverged:
            kept += (str(net.save(outputs.save)),)
        if outputs.path(TRAINING_PROGRESS).is_file():
            kept += (str(outputs.path(TRAINING_PROGRESS)),)
    if info.diverged:
        raise Diverged(f"{info.stop_reason}; the history is in {metrics}")
    if info.stopped_by.by_signal:
        where = (f"the checkpoint is in {info.checkpoint} (continue with --resume)"
                 if info.checkpoint else "no checkpoint was written (--checkpoint-dir DIR "
                                         "keeps one)")
        terminated = info.stopped_by is StopReason.TERMINATED
        words = "terminated (SIGTERM)" if terminated else "interrupted"
        raise Interrupted(f"{words} after iteration {len(info.loss)}: {where}; kept "
                          f"{', '.join(kept)}", 143 if terminated else 130)
    if info.stopped_by is StopReason.CHECKPOINT_FAILED:
        raise RuntimeError(f"training stopped: {info.stop_reason} (--checkpoint-failure "
                           f"stop); kept {', '.join(kept)}")
    return kept if main_process else ()


class Diverged(RuntimeError):
    """Training stopped on a loss or gradient that was not finite."""


def _report(info, clock: list[float], accuracy: float, test_count: int) -> None:
    devices = f"{info.num_devices} device{'s' if info.num_devices > 1 else ''}"
    print(f"Compile {info.compile_time:.1f} s, training {info.train_time:.1f} s "
          f"({info.images_per_second:,.0f} images/s on {devices})")
    start_up, load, trained, predict = (b - a for a, b in zip(clock[:-1], clock[1:]))
    print(f"Seconds: JAX start-up {start_up:.1f}, data {load:.1f}, set-up {info.setup_time:.1f}, "
          f"training {info.train_time:.1f}, "
          f"finishing {trained - info.setup_time - info.train_time:.1f}, prediction {predict:.1f}")
    print(f"Set-up seconds, overlapping: compile {info.compile_time:.1f}, "
          f"placing {info.placing_time:.1f}")
    print(f"Test accuracy: {100 * accuracy:.2f}% ({test_count} images)")
