#!/usr/bin/env bash
# Is the PyTorch peer at its best? The peer (benchmarks/peer_torch.py) beside a plain
# torchvision script (benchmarks/peer_torch_plain.py) on the same GPUs, ResNet-50, 128 images
# per GPU, Adam, bf16: eager, torch.compile and torch.compile(mode="max-autotune"); the peer
# also on one fixed batch (--data fixed), which tells its data work from the network. On two
# or more GPUs, the same on DDP (the plain script through torchrun). One JSON line each.
#
#     bash benchmarks/peer_check.sh OUT_DIR
set -euo pipefail
out=${1:?usage: peer_check.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$out"
gpus=$(python -c 'import torch; print(torch.cuda.device_count())')
for mode in none default max-autotune; do
  python "$here/peer_torch_plain.py" --compile "$mode" | tee -a "$out/plain.jsonl"
  if [ "$gpus" -ge 2 ]; then
    torchrun --standalone --nproc-per-node 2 "$here/peer_torch_plain.py" --compile "$mode" \
        | tee -a "$out/plain.jsonl"
  fi
done
modes="eager compile compile-max-autotune"
[ "$gpus" -ge 2 ] && modes="$modes ddp ddp-compile ddp-compile-max-autotune"
for data in augment fixed; do
  # shellcheck disable=SC2086
  python "$here/peer_torch.py" --modes $modes --data "$data" --json "$out/peer-$data.json" \
      | tee -a "$out/peer.jsonl"
done
