"""A plain torchvision ResNet-50 training loop: the yardstick for ``peer_torch.py``.

    python benchmarks/peer_torch_plain.py [--compile default|max-autotune] [--batch 128]
    torchrun --nproc-per-node 2 benchmarks/peer_torch_plain.py --compile default  # DDP

Written the way a PyTorch user would, sharing no code with the peer: one synthetic batch
on the GPU (no data pipeline, no augmentation), channels_last, bfloat16 autocast, Adam,
``cudnn.benchmark``, optionally ``torch.compile``. If the peer reports less than this on
the same machine, the peer is measuring something other than PyTorch at its best.
Prints one JSON line (rank 0) with images/s over the timed steps.
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
import torchvision

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--compile", choices=("none", "default", "max-autotune"), default="none")
p.add_argument("--batch", type=int, default=128, help="per GPU")
p.add_argument("--warmup", type=int, default=30)
p.add_argument("--steps", type=int, default=100)
p.add_argument("--device", default="cuda")
p.add_argument("--image-size", type=int, default=224)
args = p.parse_args()

world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("LOCAL_RANK", "0"))
if world > 1:  # started by torchrun
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.distributed.init_process_group("nccl" if args.device == "cuda" else "gloo")
device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
torch.backends.cudnn.benchmark = True

model = torchvision.models.resnet50(num_classes=5).to(device, memory_format=torch.channels_last)
if world > 1:
    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[rank] if device.type == "cuda" else None)
if args.compile != "none":
    model = torch.compile(model, mode=None if args.compile == "default" else args.compile)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device)
x = x.contiguous(memory_format=torch.channels_last)
y = torch.randint(0, 5, (args.batch,), device=device)


def step():
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def synchronize():
    if device.type == "cuda":
        torch.cuda.synchronize()
    if world > 1:
        torch.distributed.barrier()


t0 = time.perf_counter()
for _ in range(args.warmup):
    step()
synchronize()
warmup = time.perf_counter() - t0
t0 = time.perf_counter()
for _ in range(args.steps):
    step()
synchronize()
seconds = time.perf_counter() - t0
if rank == 0:
    print(json.dumps({"script": "peer_torch_plain", "compile": args.compile, "devices": world,
                      "per_device_batch": args.batch, "warmup_s": round(warmup, 2),
                      "step_ms": round(1e3 * seconds / args.steps, 3),
                      "images_per_s": round(world * args.batch * args.steps / seconds, 1),
                      "torch": torch.__version__}), flush=True)
if world > 1:
    torch.distributed.destroy_process_group()
