"""Which GPUs a sweep may use, where a job of one or several devices goes, and the
environment each job slot runs under.

GPUs are counted without JAX, or the parent would hold memory on every GPU its workers need.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import re
import warnings
from typing import Callable, Mapping, Sequence

from jaxflowers.host import gpus, mps

__all__ = ["AUTO_FIRST_FRACTION", "AUTO_MAX_JOBS", "Slot", "claim", "default_cpu_slots",
           "make_slots", "merge", "place", "sharing", "slot_environment", "spread",
           "visible_gpus"]


# jobs_per_device="auto" (``sweep.auto``): at most this many jobs on a GPU.
AUTO_MAX_JOBS = 8
AUTO_FIRST_FRACTION = 0.9  # the first job's cap while its footprint is measured


@dataclasses.dataclass(frozen=True)
class Slot:
    """One place a job can run: a GPU (``gpu`` is its CUDA_VISIBLE_DEVICES token) or a CPU.

    A job over several devices runs on a slot made by ``merge``: ``gpu`` lists its GPUs
    ("0,1"), ``devices`` their positions, and it owns each of them whole.
    """

    index: int
    gpu: str | None
    jobs_per_device: int = 1
    device: int = 0  # the position of its device (a GPU, or a CPU device) in the pool
    devices: tuple[int, ...] = ()  # a merged slot's devices (positions); () for one device
    memory_fraction: float | None = None  # the job's cap of its GPU's memory; None: the rule

    @property
    def num_devices(self) -> int:
        """How many devices a job on this slot trains on."""
        return max(1, len(self.devices))

    @property
    def where(self) -> str:
        """Where a job on this slot runs, in words: "GPU 1", "GPUs 0,1", "CPU devices 0,1"."""
        plural = "s" if self.num_devices > 1 else ""
        if self.gpu is not None:
            return f"GPU{plural} {self.gpu}"
        return f"CPU device{plural} {','.join(map(str, self.devices or (self.device,)))}"


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


def make_slots(devices: str | int | Sequence[int | str], jobs_per_device: int | str,
               gpus: Sequence[str], cpu_slots: int | None = None) -> list[Slot]:
    """The ``len(devices) * jobs_per_device`` slots of a pool, GPU-major (``devices`` as in
    ``DevicePool``; ``gpus``: ``visible_gpus()``; ``cpu_slots``: for "all" without GPUs).
    "auto": one slot per device, a GPU's capped at ``AUTO_FIRST_FRACTION`` (measured alone,
    before others join it: ``auto.more_slots``)."""
    if jobs_per_device == "auto":
        return [dataclasses.replace(s, memory_fraction=AUTO_FIRST_FRACTION)
                if s.gpu is not None else s for s in make_slots(devices, 1, gpus, cpu_slots)]
    if isinstance(jobs_per_device, bool) or not isinstance(jobs_per_device, int) \
            or jobs_per_device < 1:
        raise ValueError(f"jobs_per_device={jobs_per_device!r} must be a positive integer")
    chosen = _choose_devices(devices, list(gpus), cpu_slots or default_cpu_slots())
    return [Slot(i * jobs_per_device + j, gpu, jobs_per_device, device=i)
            for i, gpu in enumerate(chosen) for j in range(jobs_per_device)]


def place(free: Sequence[Slot], num_devices: int, *, avoid=frozenset()) -> list[Slot] | None:
    """The free slots a job of ``num_devices`` devices takes now, or None if it must wait.

    One device: the first free slot whose device is not in ``avoid``. Several: every slot
    of the first ``num_devices`` devices (by position) that have no job at all, so a
    multi-device job never shares a GPU's memory with packed jobs.
    """
    if num_devices == 1:
        return next(([slot] for slot in free if slot.device not in avoid), None)
    idle = [d for d, slots in _by_device(free).items()
            if d not in avoid and len(slots) == slots[0].jobs_per_device]
    if len(idle) < num_devices:
        return None
    chosen = set(sorted(idle)[:num_devices])
    return [slot for slot in free if slot.device in chosen]


def claim(free: Sequence[Slot], devices: Sequence[int], num_devices: int, *,
          avoid=frozenset()) -> set[int]:
    """The devices a waiting job of ``num_devices`` devices keeps for itself: those of
    ``devices`` (not in ``avoid``) with the most free slots, so no later job starts on them
    and they drain; empty when too few devices are left to claim."""
    counts = {d: len(slots) for d, slots in _by_device(free).items()}
    candidates = sorted((d for d in set(devices) if d not in avoid),
                        key=lambda d: (-counts.get(d, 0), d))
    return set(candidates[:num_devices]) if len(candidates) >= num_devices else set()


def merge(slots: Sequence[Slot]) -> Slot:
    """The one slot a job over the devices of ``slots`` (every slot of each) runs on."""
    first, devices = slots[0], sorted({slot.device for slot in slots})
    if len(devices) == 1:
        return first
    gpus = list(dict.fromkeys(slot.gpu for slot in sorted(slots, key=lambda s: s.device)))
    gpu = None if first.gpu is None else ",".join(gpus)
    return Slot(first.index, gpu, 1, device=devices[0], devices=tuple(devices))


def spread(slots: Sequence[Slot], count: int) -> list[Slot]:
    """``count`` of ``slots`` (at most all), one per device in turn: where jobs waiting for
    a slot are likeliest to start."""
    rounds = itertools.zip_longest(*_by_device(slots).values())
    return [slot for round_ in rounds for slot in round_ if slot is not None][:count]


def _by_device(slots: Sequence[Slot]) -> dict[int, list[Slot]]:
    grouped: dict[int, list[Slot]] = {}
    for slot in slots:
        grouped.setdefault(slot.device, []).append(slot)
    return grouped


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
    """A worker's environment on ``slot``: only its GPUs (or ``JAX_PLATFORMS=cpu``, with as
    many CPU devices as the slot has), memory capped when packed (default
    ``0.9 / jobs_per_device``) without preallocation, NVLink multicast off."""
    env = dict(base)
    env["NCCL_NVLS_ENABLE"] = "0"
    if slot.gpu is None:
        env["JAX_PLATFORMS"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
        if slot.num_devices > 1:
            env.update(_cpu_devices(env, slot.num_devices))
        return env
    env["CUDA_VISIBLE_DEVICES"] = slot.gpu
    memory_fraction = slot.memory_fraction if memory_fraction is None else memory_fraction
    if slot.jobs_per_device > 1 or memory_fraction is not None:
        fraction = memory_fraction if memory_fraction is not None else 0.9 / slot.jobs_per_device
        if not 0 < fraction <= 1:
            raise ValueError(f"memory_fraction={fraction!r} must lie in (0, 1]")
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.4g}"
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def _cpu_devices(env: Mapping[str, str], count: int) -> dict[str, str]:
    """The XLA flags (and JAX option) that give a CPU worker ``count`` devices."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", env.get("XLA_FLAGS", ""))
    flags = f"{flags.strip()} --xla_force_host_platform_device_count={count}".strip()
    return {"XLA_FLAGS": flags, "JAX_NUM_CPU_DEVICES": str(count)}


def sharing(slots: Sequence[Slot], backend, requested, *, auto: bool,
            while_starting: Callable[[], None] | None = None) -> str | None:
    """How jobs packed on one GPU share it: "mps" (the backend starts it, calling
    ``while_starting`` once its clients' environment is known), "time-slicing" (``requested``
    False, or MPS could not start: a warning), or None (none packed)."""
    packed = sorted({s.gpu for s in slots if s.gpu is not None
                     and (s.jobs_per_device > 1 or auto)})
    if not packed:
        return None
    if requested is False or (requested == "auto" and mps.configured()):
        return "mps" if mps.configured() else "time-slicing"
    try:
        return backend.share_gpus(packed, while_starting)
    except mps.MpsError as error:
        if requested is True:
            raise
        per_gpu = "" if auto else f" {slots[0].jobs_per_device}"
        warnings.warn(f"MPS could not start ({error}); the{per_gpu} jobs on each GPU take "
                      "turns on it (DevicePool(mps=False), sweep --mps off: without trying)",
                      stacklevel=3)
        return "time-slicing"
