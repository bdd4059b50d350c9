#!/usr/bin/env bash
# The whole two-GPU table in one go (one host with 2 GPUs): ResNet-50 throughput at 128 and 256
# images per GPU on 1 and 2 GPUs with the PyTorch peer in the same run, the Flowers example
# cold and warm on 2 GPUs, and the 4-depth CIFAR sweep cold with one and two jobs per GPU.
#
#     bash benchmarks/two_gpu_table.sh OUT_DIR [CIFAR_DIR]
#
# CIFAR_DIR: train/ and test/ class folders (default: synthetic ones, for time only).
# Targets it measures: >= 1.95x at 128/GPU and >= 1.97x at 256/GPU; the example <= 32 s cold
# and <= 22 s warm; the sweep <= 40 s cold with one job per GPU, <= 35 s with two.
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
python "$here/end_to_end.py" example /tmp/flowers-synthetic --devices 2 --out "$out/example.json"
for jobs in 1 2; do
  python "$here/end_to_end.py" sweep "$cifar" --devices 2 --jobs-per-device "$jobs" \
      --runs cold --out "$out/sweep-$jobs.json"
done
