"""How a training runs on the hardware, apart from what it learns: ``ExecutionOptions``.

Each "auto" is decided by :meth:`ExecutionOptions.resolve` once the devices are known. No JAX.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jaxflowers.options.validate import check_bool, check_choice, check_int

__all__ = ["ExecutionOptions", "PARAMETER_LAYOUTS", "PLACEMENTS", "PRECISIONS", "Resolved",
           "STRATEGIES"]

STRATEGIES = ("shard_map", "pmap")
PRECISIONS = ("auto", "float32", "bfloat16")
PLACEMENTS = ("auto", "resident", "stream")
PARAMETER_LAYOUTS = ("auto", "tree", "flat")
# Images with fewer pixels than this run several iterations per dispatch on accelerators.
_SMALL_IMAGE_PIXELS = 96 * 96
_SMALL_IMAGE_BLOCK = 16


@dataclasses.dataclass(frozen=True)
class ExecutionOptions:
    """How ``train`` executes; "auto" suits the devices. A bad value is a ``ValueError``."""

    num_devices: int | None = None  # use only the first N devices (per process); None: all
    strategy: str = "shard_map"  # how the per-device step is wrapped: "shard_map" or "pmap"
    precision: str = "auto"  # compute dtype: "float32", "bfloat16"; "auto": bf16 on GPUs
    sync_batch_norm: bool = False  # batch-norm statistics over the global batch
    steps_per_dispatch: int | None = None  # iterations per compiled call; None: by image size
    data_placement: str = "auto"  # "resident" on every device, "stream" from host; "auto": by size
    parameter_layout: str = "auto"  # "flat" (one vector) or "tree" (per leaf); "auto": flat on GPUs

    def __post_init__(self):
        check_choice(self, "strategy", STRATEGIES)
        check_choice(self, "precision", PRECISIONS)
        check_choice(self, "data_placement", PLACEMENTS)
        check_choice(self, "parameter_layout", PARAMETER_LAYOUTS)
        check_bool(self, "sync_batch_norm")
        check_int(self, "num_devices", minimum=1, optional=True)
        check_int(self, "steps_per_dispatch", minimum=1, optional=True)

    def replace(self, **changes) -> "ExecutionOptions":
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The fields as JSON-able data (``from_dict`` inverts it)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields) -> "ExecutionOptions":
        """Options from a dict of fields; an unknown field is a ``ValueError`` naming it."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = [name for name in fields if name not in known]
        if unknown:
            raise ValueError(f"unknown execution option {unknown[0]!r}: ExecutionOptions has "
                             f"no such field (it has {', '.join(known)})")
        return cls(**fields)

    def resolve(self, platform: str, image_shape, *, streamed: bool) -> "Resolved":
        """The concrete choices for ``platform`` ("cpu", "gpu", ...) and (H, W, C) images.

        Returns:
          ``Resolved``; a ``streamed`` training set runs one iteration per dispatch.
        """
        accelerator = platform != "cpu"
        precision = self.precision
        if precision == "auto":  # bfloat16 for the tensor cores
            precision = "bfloat16" if accelerator else "float32"
        block = self.steps_per_dispatch
        if streamed:  # a batch arrives per iteration
            block = 1
        elif block is None:
            # why: a small image's step is shorter than its dispatch, so Python would pace the
            # device; XLA:CPU runs convolutions inside loops slower than outside
            small = image_shape[0] * image_shape[1] < _SMALL_IMAGE_PIXELS
            block = _SMALL_IMAGE_BLOCK if small and accelerator else 1
        # why flat on GPUs: one all-reduce and one update instead of one per leaf; XLA:CPU runs
        # the vector update slower
        flat = self.parameter_layout == "flat" or (self.parameter_layout == "auto"
                                                   and platform == "gpu")
        return Resolved(precision, block, flat)


class Resolved(NamedTuple):
    """``ExecutionOptions`` with every "auto" decided for one set of devices."""

    precision: str  # "float32" or "bfloat16"
    steps_per_dispatch: int
    flat_parameters: bool
