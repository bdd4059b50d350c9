"""Scaling benchmark of ``jaxflowers.train``: ``python -m jaxflowers.bench``.

One ``train`` call per model, strategy, weak/strong scaling and device count, timed between
the trainer's full syncs (``_SyncClock``). The first line above is the CLI's description.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import itertools
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

from jaxflowers import recipes
from jaxflowers.bench.report import draw, fold_peer, save, table_lines
from jaxflowers.data.augment import Augmentation
from jaxflowers.data.imageset import ImageSet
from jaxflowers.options.execution import PRECISIONS, STRATEGIES, ExecutionOptions
from jaxflowers.options.training import TrainingOptions
from jaxflowers.plots import speedup_table

__all__ = ["BenchModel", "BenchSettings", "CPU_NOTE", "PEER_SCRIPT", "QUICK", "SCALINGS",
           "config_options", "describe_devices", "device_counts", "environment", "main", "measure",
           "parse_model", "run", "run_peer", "settings_from_args", "synthetic_set"]

SCALINGS = ("weak", "strong")
PEER_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "peer_torch.py"
CPU_NOTE = ("NOTE: these CPU devices are one host's cores split into {n} (XLA's "
            "--xla_force_host_platform_device_count); their speedups mean nothing (run on "
            "GPUs for real numbers).")


@dataclasses.dataclass(frozen=True)
class BenchModel:
    """One benchmarked network and its synthetic data set."""

    name: str  # "resnet50" or "cifar_net:<depth>"
    image_size: int  # square images, pixels
    num_classes: int
    num_images: int  # synthetic training images resident on every device
    per_device_batch: int  # default per-device mini-batch
    window_steps: int  # default iterations per timed window
    augmentation: Augmentation

    def build(self):
        """The flax module: ``resnet50(num_classes)`` or ``cifar_net(depth, num_classes)``."""
        name, _, depth = self.name.partition(":")
        spec = (name, {"depth": int(depth)}) if depth else name
        return recipes.build_model(spec, self.num_classes)


def parse_model(name: str) -> BenchModel:
    """The ``BenchModel`` of ``"resnet50"`` (Flowers) or ``"cifar_net:<depth>"`` (CIFAR-10)."""
    if name == "resnet50":  # the multi-GPU example's network, images and augmenter
        return BenchModel(name, recipes.IMAGE_SIZE[name][0], 5, 3670, 64, 20,
                          recipes.augmentation("flowers"))
    kind, _, depth = name.partition(":")
    if kind != "cifar_net" or not depth.isdigit() or int(depth) < 1:
        raise ValueError(f"model {name!r} is not allowed; use resnet50 or cifar_net:<depth>, "
                         "e.g. cifar_net:2")
    # The parfeval example's: random mirror and +-4 px shifts.
    return BenchModel(name, recipes.IMAGE_SIZE[kind][0], 10, 45000, 128, 256,
                      recipes.augmentation("sweep"))


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """What to measure; None fields take each model's default."""

    models: tuple[str, ...] = ("resnet50", "cifar_net:1")
    devices: tuple[int, ...] | None = None  # None: 1, 2, 4, ... and the local count
    strategies: tuple[str, ...] = STRATEGIES
    scalings: tuple[str, ...] = SCALINGS
    per_device_batch: int | None = None  # None: 64 for resnet50, 128 for cifar_net
    global_batch: int | None = None  # strong scaling; None: per-device x largest count
    precision: str = "auto"  # "auto": bfloat16 on GPU, float32 on CPU
    solver: str = "adam"  # "adam" (the Flowers example's) or "sgdm"; the torch peer uses the same
    windows: int = 5  # timed windows per configuration (after one warm-up window)
    window_steps: int | None = None  # iterations per window; None: 20 resnet50, 256 cifar
    num_images: int | None = None  # synthetic set size; None: the model's default
    seed: int = 0


QUICK = {"models": ("cifar_net:1",), "strategies": ("shard_map",), "scalings": ("weak",),
         "num_images": 128, "per_device_batch": 8, "window_steps": 2, "windows": 2}


def synthetic_set(num_images: int, image_size: int, num_classes: int, *, seed: int = 0):
    """Uniform-noise uint8 images (N, S, S, 3), balanced int32 labels: for throughput only."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (num_images, image_size, image_size, 3), dtype=np.uint8)
    labels = rng.permutation(np.arange(num_images) % num_classes).astype(np.int32)
    return ImageSet(images, labels, tuple(f"class{i}" for i in range(num_classes)))


def device_counts(available: int, requested=None) -> list[int]:
    """``requested`` checked against ``available``, or 1, 2, 4, ... and ``available``."""
    if requested:
        bad = [n for n in requested if not 1 <= n <= available]
        if bad:
            raise ValueError(f"--devices {bad} outside 1..{available}, the local devices")
        return sorted(set(requested))
    return sorted({2 ** k for k in range(available.bit_length()) if 2 ** k <= available}
                  | {available})


class _SyncClock:
    """``output_fn`` reading the clock at the trainer's full syncs (iterations kW)."""
    # With verbose=False and verbose_frequency=W the trainer fetches every dispatched metric
    # at iteration 1 and every W-th, then calls output_fn: a synchronised timestamp. Other
    # calls lag one dispatch. Window k spans kW -> (k+1)W; iterations 1..W are the warm-up.

    def __init__(self, window_steps: int, windows: int):
        self.every, self.last = window_steps, window_steps * (windows + 1)
        self.marks: dict[int, float] = {}

    def __call__(self, message: dict):
        if message["state"] != "iteration" or message["iteration"] % self.every:
            return None
        self.marks[message["iteration"]] = time.perf_counter()
        return message["iteration"] >= self.last  # True: train() stops at this sync

    def windows(self) -> list[float]:
        """Seconds of each window kW -> (k+1)W, k >= 1 (the first W iterations dropped)."""
        needed = range(self.every, self.last + 1, self.every)
        missing = [i for i in needed if i not in self.marks]
        if missing:
            raise RuntimeError(f"no synchronised timestamp at iterations {missing}; the "
                               "trainer's sync points are not where bench.py expects them")
        return np.diff([self.marks[i] for i in needed]).tolist()


def measure(data, model, options: TrainingOptions, *, window_steps: int, windows: int,
            execution=None) -> dict:
    """Train once and time ``windows`` windows of ``window_steps`` iterations after a warm-up.

    Returns:
      dict of raw numbers: windows_s, step_s, images_per_s (median window), compile_s, train_s,
      setup_s, loop_images_per_s (warm-up included), iterations, steps_per_epoch, precision.
    """
    import jax.numpy as jnp

    from jaxflowers.training.run import train

    clock = _SyncClock(window_steps, windows)
    per_epoch = len(data) // options.mini_batch_size
    options = options.replace(
        verbose=False, verbose_frequency=window_steps, output_fn=clock, validation_data=None,
        plots="none", max_epochs=math.ceil(clock.last / per_epoch))
    t0 = time.perf_counter()
    net, info = train(data, model, options, execution=execution)
    wall = time.perf_counter() - t0
    spans = clock.windows()
    median = statistics.median(spans)
    return {"windows_s": spans, "step_s": median / window_steps,
            "images_per_s": window_steps * options.mini_batch_size / median,
            "compile_s": info.compile_time, "placing_s": info.placing_time,
            "train_s": info.train_time,
            "setup_s": wall - info.compile_time - info.train_time,
            "loop_images_per_s": info.images_per_second,
            "iterations": int(len(info.iteration)), "steps_per_epoch": per_epoch,
            "precision": jnp.dtype(net.dtype).name}


def config_options(spec: BenchModel, settings: BenchSettings, *, strategy: str,
                   scaling: str, devices: int, largest: int) -> TrainingOptions:
    """Options for one configuration; weak scaling via ``TrainingOptions.scaled``."""
    per_device = settings.per_device_batch or spec.per_device_batch
    base = TrainingOptions(solver=settings.solver, mini_batch_size=per_device,
                           shuffle="every-epoch", augmentation=spec.augmentation,
                           seed=settings.seed, verbose=False)
    if scaling == "weak":  # batch x N and learning rate x N, MATLAB's multi-GPU rule
        return base.scaled(devices)
    return base.replace(mini_batch_size=settings.global_batch or per_device * largest)


def _record(spec, settings, options, strategy, scaling, n, data) -> dict:
    window = settings.window_steps or spec.window_steps
    record = {"framework": "jaxflowers", "model": spec.name, "strategy": strategy,
              "scaling": scaling, "devices": n, "global_batch": options.mini_batch_size,
              "per_device_batch": options.mini_batch_size // n, "solver": options.solver,
              "learn_rate": options.learn_rate, "image_size": spec.image_size,
              "num_images": len(data), "window_steps": window}
    execution = ExecutionOptions(precision=settings.precision, strategy=strategy, num_devices=n)
    record.update(measure(data, spec.build(), options, execution=execution, window_steps=window,
                          windows=settings.windows))
    devices = f"{n} device{'s' if n > 1 else ''}"
    print(f"  {spec.name} {strategy} {scaling} {devices}: batch {record['global_batch']}, "
          f"compile {record['compile_s']:.1f} s, {record['images_per_s']:.1f} images/s, "
          f"step {1e3 * record['step_s']:.2f} ms", flush=True)
    return record


def _model_records(spec: BenchModel, settings: BenchSettings, counts: list[int],
                   skipped: list) -> list[dict]:
    data = synthetic_set(settings.num_images or spec.num_images, spec.image_size,
                         spec.num_classes, seed=settings.seed)
    records = []
    for strategy, scaling, n in itertools.product(settings.strategies, settings.scalings,
                                                  counts):
        options = config_options(spec, settings, strategy=strategy, scaling=scaling,
                                 devices=n, largest=max(counts))
        if options.mini_batch_size % n or options.mini_batch_size > len(data):
            skipped.append(dict(model=spec.name, strategy=strategy, scaling=scaling, devices=n,
                                reason=f"global batch {options.mini_batch_size} does not split"
                                f" over {n} devices or exceeds {len(data)} images"))
            print(f"  skipped: {skipped[-1]}", flush=True)
            continue
        records.append(_record(spec, settings, options, strategy, scaling, n, data))
    return records


def environment() -> dict:
    """Device kind and count, library versions, host: what every number depends on."""
    import flax
    import jax
    import jaxlib
    import optax

    import jaxflowers
    devices = jax.local_devices()
    platform_name, count = devices[0].platform, len(devices)
    return {"platform": platform_name, "device_kind": devices[0].device_kind,
            "local_device_count": count, "process_count": jax.process_count(),
            "fake_cpu_devices": platform_name == "cpu" and count > 1,
            "devices": describe_devices(platform_name, devices[0].device_kind, count),
            "jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
            "optax": optax.__version__, "numpy": np.__version__,
            "jaxflowers": jaxflowers.__version__, "python": platform.python_version(),
            "host": platform.node(), "cpu_count": os.cpu_count(),
            "xla_flags": os.environ.get("XLA_FLAGS", "")}


def describe_devices(platform_name: str, kind: str, count: int) -> str:
    """The devices in words, for the printout and the figure's title."""
    if platform_name != "cpu":
        return f"{count} x {kind}"
    cores = f"{os.cpu_count()} cores"
    if count == 1:
        return f"1 CPU device (XLA:CPU on the host's {cores})"
    return f"{count} CPU devices splitting one host's {cores}"


def run(settings: BenchSettings) -> dict:
    """Measure every configuration; the bench JSON (environment, settings, results, ...)."""
    env = environment()
    counts = device_counts(env["local_device_count"], settings.devices)
    print(f"jaxflowers.bench: {env['devices']}, device counts {counts}", flush=True)
    skipped: list = []
    results = [r for name in settings.models
               for r in _model_records(parse_model(name), settings, counts, skipped)]
    return {"schema": 1, "created": datetime.datetime.now().astimezone().isoformat(),
            "environment": env, "settings": dataclasses.asdict(settings),
            "results": results, "speedup": speedup_table(results) if results else [],
            "skipped": skipped}


def run_peer(settings: BenchSettings, out: pathlib.Path, *, quick: bool) -> dict:
    """benchmarks/peer_torch.py on ResNet-50 in a subprocess; run it before JAX takes the GPUs."""
    if importlib.util.find_spec("torch") is None or not PEER_SCRIPT.is_file():
        return {"skipped": f"torch not importable or {PEER_SCRIPT} missing", "results": []}
    spec = parse_model("resnet50")
    size, batch, steps, windows, images = (
        (64, 4, 2, 2, 64) if quick else
        (spec.image_size, settings.per_device_batch or spec.per_device_batch,
         settings.window_steps or spec.window_steps, settings.windows,
         settings.num_images or spec.num_images))
    path = out / "peer_torch.json"
    cmd = [sys.executable, str(PEER_SCRIPT), "--json", str(path), "--image-size", str(size),
           "--batch", str(batch), "--steps", str(steps), "--windows", str(windows),
           "--num-images", str(images), "--precision", settings.precision,
           "--solver", "sgd" if settings.solver == "sgdm" else "adam"]
    print("peer:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd)
    if done.returncode or not path.is_file():
        return {"skipped": f"peer_torch.py exited with {done.returncode}", "results": []}
    return json.loads(path.read_text())


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """``BenchSettings`` from the parsed flags; ``--quick`` defaults yield to explicit ones."""
    fields = {f.name for f in dataclasses.fields(BenchSettings)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items()
             if k in fields and v is not None}
    return BenchSettings(**({**QUICK, **given} if args.quick else given))


def _parser() -> argparse.ArgumentParser:
    d = BenchSettings()
    p = argparse.ArgumentParser(prog="python -m jaxflowers.bench", description=__doc__.split(
        "\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", metavar="MODEL",
                   help=f"resnet50 and/or cifar_net:<depth> (default: {' '.join(d.models)})")
    p.add_argument("--devices", nargs="+", type=int, metavar="N",
                   help="device counts to measure (default: 1, 2, 4, ... and all)")
    p.add_argument("--strategies", nargs="+", choices=STRATEGIES,
                   help=f"(default: {' '.join(d.strategies)})")
    p.add_argument("--scalings", nargs="+", choices=SCALINGS,
                   help=f"weak: batch x devices; strong: one global batch (default: "
                        f"{' '.join(d.scalings)})")
    p.add_argument("--per-device-batch", type=int, metavar="IMAGES",
                   help="(default: 64 for resnet50, 128 for cifar_net)")
    p.add_argument("--global-batch", type=int, metavar="IMAGES",
                   help="strong scaling's constant global batch (default: per-device batch x "
                        "the largest device count)")
    p.add_argument("--precision", choices=PRECISIONS,
                   help=f"(default: {d.precision}: bfloat16 on GPUs, float32 on CPUs)")
    p.add_argument("--solver", choices=("adam", "sgdm"),
                   help=f"the torch peer uses the same (default: {d.solver}, the Flowers "
                        "example's)")
    p.add_argument("--windows", type=int, metavar="N",
                   help=f"timed windows per configuration, after a warm-up (default: "
                        f"{d.windows})")
    p.add_argument("--window-steps", type=int, metavar="N",
                   help="iterations per timed window (default: 20 for resnet50, 256 for "
                        "cifar_net)")
    p.add_argument("--num-images", type=int, metavar="N",
                   help="synthetic training set size (default: 3670 for resnet50, 45000 for "
                        "cifar_net)")
    p.add_argument("--quick", action="store_true",
                   help="CI size: cifar_net:1, shard_map, weak, 128 images of 8 per device, "
                        "2 windows of 2 iterations; other flags still apply (default: off)")
    p.add_argument("--peer", choices=("torch",),
                   help="also run benchmarks/peer_torch.py (default: none)")
    p.add_argument("--out", default="bench",
                   help="folder for bench.json and speedup.png (default: bench)")
    return p


def main(argv=None) -> int:
    """Parse flags, run the peer (if asked) before JAX takes the GPUs, then the bench."""
    args = _parser().parse_args(argv)
    settings, out = settings_from_args(args), pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    peer = run_peer(settings, out, quick=args.quick) if args.peer else None
    report = run(settings)
    if peer is not None:
        fold_peer(report, peer)
    json_path = save(report, out / "bench.json")
    draw(json_path, out / "speedup.png")
    print(f"wrote {json_path} and {out / 'speedup.png'}")
    if report["environment"]["fake_cpu_devices"]:
        print(CPU_NOTE.format(n=report["environment"]["local_device_count"]))
    print("\n".join(table_lines(report)))
    for r in report.get("peer_ratios", []):
        print(f"{r['model']} on {r['devices']} device{'s' if r['devices'] > 1 else ''}: images/s "
              f"jaxflowers {r['jaxflowers']}"
              f" / {r['torch']} = {r['ratio']:.2f}")
    if (peer or {}).get("skipped"):
        print(f"peer torch skipped: {peer['skipped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
