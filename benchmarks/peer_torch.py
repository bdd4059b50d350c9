"""The PyTorch peer of ``python -m jaxflowers.bench``: torchvision's ResNet-50, same job.

    python benchmarks/peer_torch.py [--modes eager compile compile-max-autotune ddp ...]
        [--batch 128] [--solver adam|sgd] [--data augment|fixed]
        [--precision auto|float32|bfloat16] [--json peer_torch.json]
    python benchmarks/peer_torch.py --device cpu --batch 4 --steps 2 --image-size 64  # smoke

What runs: ``torchvision.models.resnet50(num_classes=5)`` in channels_last, bfloat16
autocast on GPU (``--precision``; float32 on CPU by default, as jaxflowers' "auto"), SGD
Adam (or SGD with momentum 0.9), weight decay 1e-4. The synthetic uint8 set (3,670
images at 224x224) lives on the device; every step gathers a random batch there (indices
drawn with replacement) and augments it there with torch ops (random left-right flip,
+-30 px translation in x and y with zero fill: jaxflowers' Augmentation), then
normalises; ``--data fixed`` trains on one fixed batch instead, as
``peer_torch_plain.py`` does, to tell the data's cost from the network's.
Modes: ``eager``, ``compile`` and ``compile-max-autotune`` (``torch.compile`` of the
model, default mode or "max-autotune"), and the same three on DistributedDataParallel
(``ddp``, ``ddp-compile``, ``ddp-compile-max-autotune``) on ``--ddp-gpus`` GPUs, spawned
with torch.multiprocessing, no torchrun; NCCL with NCCL_NVLS_ENABLE=0, gloo on CPU.
``--batch`` is per device, so DDP is weak scaling.

Timing, as the jaxflowers bench: ``--steps`` warm-up iterations first (torch.compile and
cuDNN autotuning happen there; the first step's time is ``compile_s``, the warm-up's
``warmup_s``), then ``--windows`` windows of ``--steps`` iterations, each between two
``torch.cuda.synchronize()`` calls (DDP: rank 0's clock, after a barrier); images/s is
world x batch x steps / median window. Prints one JSON line per mode and writes all of
them, with torch/CUDA versions and the device name, to ``--json``. Needs torch and
torchvision (neither is a jaxflowers dependency); without torchvision it says so and exits
0 with no results, unless ``--model tiny`` (a small CNN for testing the script itself).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import json
import os
import pathlib
import platform
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

# mode -> (torch.compile's mode, or None for eager; DDP)
MODES = {"eager": (None, False), "compile": ("default", False),
         "compile-max-autotune": ("max-autotune", False), "ddp": (None, True),
         "ddp-compile": ("default", True), "ddp-compile-max-autotune": ("max-autotune", True)}
# Per-channel mean and std of uint8 uniform noise: what jaxflowers' channel_stats finds.
MEAN, STD = 127.5, 73.9


@dataclasses.dataclass(frozen=True)
class Config:
    """One measurement's settings (plain values, so spawned ranks can receive it)."""

    device: str  # "cuda" or "cpu"
    model: str  # "resnet50" or "tiny"
    batch: int  # per device
    image_size: int
    num_classes: int
    num_images: int
    max_shift: int  # translation range, pixels, both directions
    precision: str  # "float32" or "bfloat16" (resolved)
    solver: str  # "sgd" or "adam"
    data: str  # "augment" (a gathered, augmented batch each step) or "fixed" (one batch)
    steps: int  # iterations per window (and of the warm-up)
    windows: int
    seed: int


def torchvision_problem() -> str | None:
    """Why torchvision cannot be used here, or None when it can."""
    try:
        importlib.import_module("torchvision")
    except Exception as error:  # noqa: BLE001 (a torch/torchvision mismatch raises RuntimeError)
        return (f"torchvision is not usable with torch {torch.__version__} "
                f"({type(error).__name__}: {error})")
    return None


def build_model(cfg: Config):
    """``torchvision.models.resnet50(num_classes=...)`` (or the tiny test CNN), channels_last,
    on ``cfg.device``."""
    if cfg.model == "tiny":
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, cfg.num_classes))
    else:
        import torchvision
        model = torchvision.models.resnet50(num_classes=cfg.num_classes)
    return model.to(cfg.device, memory_format=torch.channels_last)


def synthetic(cfg: Config, device):
    """uint8 images (N, S, S, 3) and int64 labels (N,), generated on ``device``."""
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    shape = (cfg.num_images, cfg.image_size, cfg.image_size, 3)
    images = torch.randint(0, 256, shape, dtype=torch.uint8, device=device, generator=gen)
    labels = torch.randint(0, cfg.num_classes, (cfg.num_images,), device=device, generator=gen)
    return images, labels


def augment(images: torch.Tensor, max_shift: int, gen: torch.Generator) -> torch.Tensor:
    """Random left-right flip, then a shift of +-``max_shift`` px in x and y, zero fill.

    Same rule as jaxflowers' Augmentation: ``out[y, x] = flipped[y - dy, x - dx]`` inside
    the image, else 0. One gather over (B, H, W), no padded temporaries. uint8 (B, H, W, C).
    """
    b, h, w, _ = images.shape
    dev = images.device
    flip = torch.rand(b, device=dev, generator=gen) < 0.5
    dx, dy = torch.randint(-max_shift, max_shift + 1, (2, b, 1), device=dev, generator=gen)
    xs = torch.arange(w, device=dev)[None] - dx  # (B, W) source column before the flip
    ys = torch.arange(h, device=dev)[None] - dy  # (B, H) source row
    inside = ((ys >= 0) & (ys < h))[:, :, None] & ((xs >= 0) & (xs < w))[:, None, :]
    cols = torch.where(flip[:, None], w - 1 - xs, xs).clamp(0, w - 1)
    rows = ys.clamp(0, h - 1)
    moved = images[torch.arange(b, device=dev)[:, None, None], rows[:, :, None], cols[:, None, :]]
    return moved * inside[..., None].to(moved.dtype)


def make_step(model, cfg: Config, data):
    """A closure running one training iteration (gather, augment, forward, backward, update)."""
    images, labels = data
    gen = torch.Generator(device=images.device).manual_seed(cfg.seed + 1)
    if cfg.solver == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)
    autocast = torch.autocast(cfg.device, dtype=torch.bfloat16,
                              enabled=cfg.precision == "bfloat16")

    def batch():
        idx = torch.randint(0, cfg.num_images, (cfg.batch,), device=images.device, generator=gen)
        x = augment(images[idx], cfg.max_shift, gen).permute(0, 3, 1, 2)  # NCHW view of NHWC
        return ((x.float() - MEAN) / STD).contiguous(memory_format=torch.channels_last), labels[idx]

    fixed = batch() if cfg.data == "fixed" else None

    def step():
        x, y = fixed or batch()
        with autocast:
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _sync(device: str, distributed: bool) -> None:
    if device == "cuda":
        torch.cuda.synchronize()  # a CPU-GPU sync point: the clock reads finished work
    if distributed:
        torch.distributed.barrier()


def time_windows(step, cfg: Config, *, distributed: bool = False) -> dict:
    """Warm-up, then ``cfg.windows`` synchronised windows of ``cfg.steps`` iterations."""
    _sync(cfg.device, distributed)
    t0 = time.perf_counter()
    step()
    _sync(cfg.device, distributed)
    first = time.perf_counter() - t0
    for _ in range(cfg.steps - 1):
        step()
    _sync(cfg.device, distributed)
    warmup, spans = time.perf_counter() - t0, []
    for _ in range(cfg.windows):
        t0 = time.perf_counter()
        for _ in range(cfg.steps):
            step()
        _sync(cfg.device, distributed)
        spans.append(time.perf_counter() - t0)
    return {"compile_s": first, "warmup_s": warmup, "windows_s": spans,
            "step_s": statistics.median(spans) / cfg.steps}


def record(cfg: Config, mode: str, world: int, timing: dict) -> dict:
    """A bench record (the keys ``jaxflowers.plots.speedup`` reads, and the raw numbers)."""
    strategy = {None: "torch-eager", "default": "torch-compile",
                "max-autotune": "torch-compile-max-autotune"}[MODES[mode][0]]
    return {"framework": "torch", "model": cfg.model, "mode": mode, "strategy": strategy,
            "scaling": "weak", "devices": world, "per_device_batch": cfg.batch,
            "global_batch": cfg.batch * world, "image_size": cfg.image_size,
            "num_images": cfg.num_images, "precision": cfg.precision, "solver": cfg.solver,
            "data": cfg.data, "compile_mode": MODES[mode][0],
            "window_steps": cfg.steps, **timing,
            "images_per_s": world * cfg.batch * cfg.steps / statistics.median(timing["windows_s"])}


def compiled(model, mode: str):
    """``model`` through ``torch.compile`` in the mode's compile mode (as is for eager)."""
    compile_mode = MODES[mode][0]
    if compile_mode is None:
        return model
    return torch.compile(model, mode=None if compile_mode == "default" else compile_mode)


def run_single(cfg: Config, mode: str) -> dict:
    """``eager`` or ``compile`` on one device."""
    model = build_model(cfg)
    model = compiled(model, mode)
    step = make_step(model, cfg, synthetic(cfg, cfg.device))
    return record(cfg, mode, 1, time_windows(step, cfg))


def _ddp_rank(rank: int, world: int, cfg: Config, mode: str, port: int, result: str) -> None:
    """One DDP process: its own GPU, its own copy of the set, a batch of ``cfg.batch``."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.backends.cudnn.benchmark = True  # main() does not run in spawned processes
    backend = "nccl" if cfg.device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        device = f"cuda:{rank}" if cfg.device == "cuda" else "cpu"
        if cfg.device == "cuda":
            torch.cuda.set_device(rank)
        model = build_model(dataclasses.replace(cfg, device=device))
        model = DDP(model, device_ids=[rank] if cfg.device == "cuda" else None)
        model = compiled(model, mode)
        local = dataclasses.replace(cfg, seed=cfg.seed + rank)  # each rank its own batches
        step = make_step(model, local, synthetic(cfg, device))  # the same set on every rank
        timing = time_windows(step, cfg, distributed=True)
        if rank == 0:
            pathlib.Path(result).write_text(json.dumps(record(cfg, mode, world, timing)))
    finally:
        dist.destroy_process_group()


def run_ddp(cfg: Config, mode: str, world: int) -> dict:
    """``ddp`` or ``ddp-compile``: ``world`` processes spawned here, rank 0's timing."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off (not lent on these hosts)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # hand back what earlier modes cached on GPU 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "rank0.json")
        torch.multiprocessing.spawn(_ddp_rank, args=(world, cfg, mode, port, result),
                                    nprocs=world, join=True)
        return json.loads(pathlib.Path(result).read_text())


def environment(device: str) -> dict:
    """torch, CUDA and cuDNN versions, device name and count, host."""
    cuda = device == "cuda"
    return {"framework": "torch", "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "device_kind": (torch.cuda.get_device_name(0) if cuda
                            else platform.processor() or platform.machine()),
            "device_count": torch.cuda.device_count() if cuda else 1,
            "python": platform.python_version(), "host": platform.node()}


def default_modes(device: str, ddp_gpus: int) -> list[str]:
    """eager and both compile modes; on DDP as well where there are ``ddp_gpus`` GPUs."""
    modes = ["eager", "compile", "compile-max-autotune"] if device == "cuda" else ["eager"]
    if device == "cuda" and torch.cuda.device_count() >= ddp_gpus:
        modes += ["ddp", "ddp-compile", "ddp-compile-max-autotune"]
    return modes


def run_modes(cfg: Config, modes, ddp_gpus: int) -> list[dict]:
    """Every mode's record, each also printed as one JSON line."""
    results = []
    for mode in modes:
        rec = run_ddp(cfg, mode, ddp_gpus) if MODES[mode][1] else run_single(cfg, mode)
        print(json.dumps(rec), flush=True)
        results.append(rec)
    return results


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--modes", nargs="+", choices=tuple(MODES), help="default: all that fit")
    p.add_argument("--model", default="resnet50", choices=("resnet50", "tiny"))
    p.add_argument("--batch", type=int, default=128, help="per device")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=5)
    p.add_argument("--num-images", type=int, default=3670)
    p.add_argument("--max-shift", type=int, default=30)
    p.add_argument("--precision", default="auto", choices=("auto", "float32", "bfloat16"))
    p.add_argument("--solver", default="adam", choices=("sgd", "adam"))
    p.add_argument("--data", default="augment", choices=("augment", "fixed"))
    p.add_argument("--steps", type=int, default=20, help="iterations per window and warm-up")
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--ddp-gpus", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write every record here")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    device = args.device if args.device != "auto" else (
        "cuda" if torch.cuda.is_available() else "cpu")
    precision = args.precision if args.precision != "auto" else (
        "bfloat16" if device == "cuda" else "float32")
    torch.backends.cudnn.benchmark = True  # autotuned in the warm-up, outside the windows
    cfg = Config(device, args.model, args.batch, args.image_size, args.num_classes,
                 max(args.num_images, args.batch), args.max_shift, precision, args.solver,
                 args.data, args.steps, args.windows, args.seed)
    skipped = torchvision_problem() if cfg.model == "resnet50" else None
    if skipped:
        print(f"peer_torch: skipping ResNet-50: {skipped}", file=sys.stderr)
    results = [] if skipped else run_modes(
        cfg, args.modes or default_modes(device, args.ddp_gpus), args.ddp_gpus)
    report = {"environment": environment(device), "config": dataclasses.asdict(cfg),
              "results": results, "skipped": skipped}
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
