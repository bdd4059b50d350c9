"""Which GPUs this machine has and this process may use, without JAX.

The one listing of GPUs and reading of ``CUDA_VISIBLE_DEVICES``; it asks NVML or ``nvidia-smi``
because JAX's GPU backend would hold memory on every GPU.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Sequence

__all__ = ["cuda_order", "has_nvidia_driver", "physical_gpus", "text", "uuid_position"]

_GPU_LINE = re.compile(r"^GPU (\d+):.*\(UUID: (\S+)\)")


def physical_gpus(nvml=None) -> list[tuple[str, str]]:
    """(index, UUID) of every GPU, from ``nvml`` (a started ``pynvml``) or NVML or nvidia-smi."""
    if nvml is not None:
        return [(str(i), text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))))
                for i in range(nvml.nvmlDeviceGetCount())]
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 (not installed, no driver: ask nvidia-smi)
        return _nvidia_smi()
    try:
        return physical_gpus(pynvml)
    finally:
        pynvml.nvmlShutdown()


def has_nvidia_driver() -> bool:
    """Whether this machine has an NVIDIA driver at all (so a GPU could be watched)."""
    return os.path.exists("/proc/driver/nvidia") or shutil.which("nvidia-smi") is not None


def text(value) -> str:
    """A name NVML gave as bytes or str, as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvidia_smi() -> list[tuple[str, str]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [m.groups() for m in map(_GPU_LINE.match, out.stdout.splitlines()) if m]


def uuid_position(prefix: str, physical: Sequence[tuple[str, str]]) -> int | None:
    """Position in ``physical`` of the one GPU whose UUID starts with ``prefix``, else None."""
    found = [i for i, (_, uuid) in enumerate(physical) if uuid.startswith(prefix)]
    return found[0] if len(found) == 1 else None


def cuda_order(mask: str | None, physical: Sequence[tuple[str, str]]) -> list[tuple[str, int]]:
    """The GPUs CUDA shows for ``CUDA_VISIBLE_DEVICES=mask`` (None: unset), in CUDA's order.

    Returns (token of ``mask``, position in ``physical``) per visible GPU; as in CUDA, the first
    token naming no GPU ("-1", a MIG id, a bad index or UUID) hides the rest.
    """
    if mask is None:
        return [(index, i) for i, (index, _) in enumerate(physical)]
    visible = []
    for token in (t.strip() for t in mask.split(",")):
        if token.isdigit():
            position = int(token) if int(token) < len(physical) else None
        elif token.startswith("GPU-"):
            position = uuid_position(token, physical)
        else:
            position = None
        if position is None:
            break
        visible.append((token, position))
    return visible
