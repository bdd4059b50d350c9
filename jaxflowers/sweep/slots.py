"""Which GPUs a sweep may use and the environment each job slot runs under.

GPUs are counted without JAX, or the parent would hold memory on every GPU its workers need.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Sequence

from jaxflowers.host import gpus

__all__ = ["Slot", "default_cpu_slots", "make_slots", "slot_environment", "visible_gpus"]


@dataclasses.dataclass(frozen=True)
class Slot:
    """One place a job can run: a GPU (``gpu`` is its CUDA_VISIBLE_DEVICES token) or a CPU."""

    index: int
    gpu: str | None
    jobs_per_device: int = 1


def visible_gpus(environ: Mapping[str, str] | None = None,
                 physical: Sequence[tuple[str, str]] | None = None) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES tokens in CUDA order (defaults:
    ``os.environ``, ``gpus.physical_gpus()``)."""
    environ = os.environ if environ is None else environ
    physical = gpus.physical_gpus() if physical is None else list(physical)
    return [token for token, _ in gpus.cuda_order(environ.get("CUDA_VISIBLE_DEVICES"),
                                                    physical)]


def default_cpu_slots(cpu_count: int | None = None) -> int:
    """Concurrent CPU jobs when there is no GPU: one per 8 cores, at least 2."""
    return max(2, (cpu_count or os.cpu_count() or 2) // 8)


def make_slots(devices: str | int | Sequence[int | str], jobs_per_device: int,
               gpus: Sequence[str], cpu_slots: int | None = None) -> list[Slot]:
    """The ``len(devices) * jobs_per_device`` slots of a pool, GPU-major (``devices`` as in
    ``DevicePool``; ``gpus``: ``visible_gpus()``; ``cpu_slots``: for "all" without GPUs)."""
    if isinstance(jobs_per_device, bool) or not isinstance(jobs_per_device, int) \
            or jobs_per_device < 1:
        raise ValueError(f"jobs_per_device={jobs_per_device!r} must be a positive integer")
    chosen = _choose_devices(devices, list(gpus), cpu_slots or default_cpu_slots())
    return [Slot(i * jobs_per_device + j, gpu, jobs_per_device)
            for i, gpu in enumerate(chosen) for j in range(jobs_per_device)]


def _choose_devices(devices, gpus: list[str], cpu_slots: int) -> list[str | None]:
    if isinstance(devices, str):
        if devices != "all":
            raise ValueError(f'devices={devices!r}: use "all", a count or a list of GPU ids')
        return list(gpus) or [None] * cpu_slots
    if isinstance(devices, int) and not isinstance(devices, bool):
        if devices < 1:
            raise ValueError(f"devices={devices} must be at least 1")
        if not gpus:
            return [None] * devices
        if devices > len(gpus):
            raise ValueError(f"devices={devices} but only {len(gpus)} GPUs are visible: {gpus}")
        return list(gpus[:devices])
    chosen = [str(d) for d in devices]
    missing = [d for d in chosen if d not in gpus]
    if missing or not chosen:
        raise ValueError(f"devices={list(devices)!r}: GPUs {missing or '[]'} are not among "
                         f"the visible GPUs {gpus}")
    return chosen


def slot_environment(slot: Slot, base: Mapping[str, str], *,
                     memory_fraction: float | None = None) -> dict[str, str]:
    """A worker's environment on ``slot``: only its GPU (or ``JAX_PLATFORMS=cpu``), memory capped
    when packed (default ``0.9 / jobs_per_device``) without preallocation, NVLink multicast off."""
    env = dict(base)
    env["NCCL_NVLS_ENABLE"] = "0"
    if slot.gpu is None:
        env["JAX_PLATFORMS"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
        return env
    env["CUDA_VISIBLE_DEVICES"] = slot.gpu
    if slot.jobs_per_device > 1 or memory_fraction is not None:
        fraction = memory_fraction if memory_fraction is not None else 0.9 / slot.jobs_per_device
        if not 0 < fraction <= 1:
            raise ValueError(f"memory_fraction={fraction!r} must lie in (0, 1]")
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.4g}"
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env
