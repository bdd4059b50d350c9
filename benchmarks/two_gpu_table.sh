#!/usr/bin/env bash
# The whole two-GPU table in one go (one host with 2 GPUs): ResNet-50 throughput at 128 and 256
# images per GPU on 1 and 2 GPUs with the PyTorch peer in the same run, and the plain torch
# script on DDP to check the peer; the Flowers example cold, warm and warm with a new seed on
# 2 GPUs; the 4-depth CIFAR sweep cold and warm with one job per GPU, with as many as fit
# (auto) and with four, under MPS.
#
#     bash benchmarks/two_gpu_table.sh OUT_DIR [CIFAR_DIR]
#
# CIFAR_DIR: class folders, or train/ and test/ class folders (default: synthetic ones, for
# time only). Targets it measures: >= 1.95x at 128/GPU and >= 1.97x at 256/GPU, two-GPU
# images/s >= 1.25x PyTorch DDP's best; the example <= 32 s cold and <= 22 s warm; the sweep
# <= 25 s cold and <= 15 s warm.
set -euo pipefail
out=${1:?usage: two_gpu_table.sh OUT_DIR [CIFAR_DIR]}
cifar=${2:-/tmp/cifar-synthetic}
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$out"
[ -d /tmp/flowers-synthetic ] || python "$here/synthetic_folders.py" flowers /tmp/flowers-synthetic
[ -d "$cifar" ] || python "$here/synthetic_folders.py" cifar "$cifar"
for batch in 128 256; do
  python -m jaxflowers.bench --models resnet50 --devices 1 2 --strategies shard_map \
      --scalings weak --per-device-batch "$batch" --peer torch --out "$out/bench-$batch" \
      | tail -n 12
done
torchrun --standalone --nproc_per_node 2 "$here/peer_torch_plain.py" --compile default \
    --batch 128 --warmup 100 --steps 300 | tee "$out/peer-plain-ddp.json"
python "$here/end_to_end.py" example /tmp/flowers-synthetic --devices 2 --seeds 0 1 \
    --out "$out/example.json"
for jobs in 1 auto 4; do
  python "$here/end_to_end.py" sweep "$cifar" --devices 2 --jobs-per-device "$jobs" \
      --runs cold warm --out "$out/sweep-$jobs.json"
done
