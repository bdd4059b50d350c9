"""``DevicePool(jobs_per_device="auto")``: one job per GPU first, then as many as the memory
that job measured lets fit; which GPUs are decided, and the slots each decision adds."""
from __future__ import annotations

from jaxflowers.sweep.slots import AUTO_FIRST_FRACTION, AUTO_MAX_JOBS, Slot

__all__ = ["AutoSizing", "auto_jobs", "more_slots"]

# Each job's need is its measured peak with this margin, plus this much for its CUDA context
# and MPS client.
_MARGIN, _CONTEXT = 1.25, 2**30


def auto_jobs(memory: dict, memory_fraction: float | None) -> tuple[int, float]:
    """(how many jobs fit on a GPU, its memory in bytes) from one job's ``device_memory``
    report (``peak`` and ``limit`` bytes) under its cap ``memory_fraction``."""
    total = memory["limit"] / (memory_fraction or AUTO_FIRST_FRACTION)
    need = memory["peak"] * _MARGIN + _CONTEXT
    return int(max(1, min(AUTO_MAX_JOBS, AUTO_FIRST_FRACTION * total // need))), total


def more_slots(first: Slot, start: int, count: int) -> list[Slot]:
    """The ``count - 1`` slots that join ``first`` on its GPU, numbered from ``start``."""
    return [Slot(start + k, first.gpu, count, device=first.device,
                 memory_fraction=AUTO_FIRST_FRACTION / count) for k in range(count - 1)]


class AutoSizing:
    """The GPUs decided so far (GPU -> jobs at a time on it), and what is still open."""

    def __init__(self):
        self.decided: dict[str, int] = {}

    def measured(self, slot: Slot, message: dict) -> dict | None:
        """The ``device_memory`` of ``message`` if it sizes ``slot``'s GPU: a job alone on one
        undecided GPU; None otherwise."""
        memory = message.get("device_memory")
        if memory and slot.gpu is not None and slot.num_devices == 1 \
                and slot.gpu not in self.decided:
            return memory
        return None

    def decide(self, slot: Slot, memory: dict, start: int) -> tuple[int, float, list[Slot]] | None:
        """Fix ``slot``'s GPU at as many jobs as ``memory`` lets fit: (jobs, the GPU's bytes,
        the slots added, numbered from ``start``); None if it is decided already."""
        if slot.gpu in self.decided:
            return None
        count, total = auto_jobs(memory, slot.memory_fraction)
        self.decided[slot.gpu] = count
        return count, total, more_slots(slot, start, count)

    def warm_targets(self, slots: list[Slot]) -> list[Slot]:
        """``slots`` and, for each undecided GPU, the slots it may still add (as its first)."""
        return slots + [slot for slot in slots if slot.gpu not in self.decided
                        for _ in range(AUTO_MAX_JOBS - 1)]
