"""Which GPUs this process may use, read as CUDA reads ``CUDA_VISIBLE_DEVICES``, without JAX.

The one reading of that variable, for the sweep (which hands GPUs to its workers) and the
GPU monitor (which watches them through NVML). A caller that started JAX's GPU backend
to count GPUs would hold memory on every one, so the list of physical GPUs comes from
``nvidia-smi -L`` here (or from NVML in the monitor).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import Sequence

_GPU_LINE = re.compile(r"^GPU (\d+):.*\(UUID: (\S+)\)")


def physical_gpus() -> list[tuple[str, str]]:
    """(index, UUID) of every GPU ``nvidia-smi -L`` lists; [] without a driver or a GPU."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [m.groups() for m in map(_GPU_LINE.match, out.stdout.splitlines()) if m]


def uuid_position(prefix: str, physical: Sequence[tuple[str, str]]) -> int | None:
    """Position in ``physical`` of the one GPU whose UUID starts with ``prefix`` (CUDA
    accepts unique prefixes), else None."""
    found = [i for i, (_, uuid) in enumerate(physical) if uuid.startswith(prefix)]
    return found[0] if len(found) == 1 else None


def visible_gpus(mask: str | None, physical: Sequence[tuple[str, str]]) -> list[tuple[str, int]]:
    """The GPUs CUDA shows for ``CUDA_VISIBLE_DEVICES=mask``, in CUDA's order.

    Args:
      mask: the variable's value; None when unset (every GPU is visible).
      physical: (index, UUID) of each physical GPU in index order (``physical_gpus()``).

    Returns:
      (token, position in ``physical``) per visible GPU, where token is the entry of
      ``mask`` (an index or a UUID prefix). Like CUDA, the first entry naming no GPU (an
      index out of range, an unknown or ambiguous UUID, "-1", a MIG id) hides itself and
      every entry after it.
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
