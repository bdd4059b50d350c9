"""Device meshes and the one place per-device functions are wrapped for several devices.

A per-device function knows only the axis name ``"data"``. :class:`DataParallel` runs it on
every device of a 1-D mesh through ``jax.shard_map`` (default) or ``jax.pmap``, and moves
arrays into the layout each strategy expects. Nothing else in the package builds a mesh or
calls ``shard_map``/``pmap``.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "data"
STRATEGIES = ("shard_map", "pmap")
REPLICATED = P()


def sharded(axis: int = 0) -> P:
    """The spec of an array split over the devices along ``axis``."""
    return P(*([None] * axis), AXIS)


def _shard_axis(spec: P) -> int | None:
    """Index of the dimension ``spec`` splits over the mesh, or None when replicated."""
    return next((i for i, name in enumerate(spec) if name == AXIS), None)


def select_devices(execution_environment: str = "auto", num_devices: int | None = None):
    """The local devices a training uses (MATLAB's ``ExecutionEnvironment``).

    Args:
      execution_environment: "auto" (every GPU if there is one, else the CPU devices),
        "cpu", "gpu" (one GPU) or "multi-gpu" (every local GPU).
      num_devices: keep only the first ``num_devices`` of those.

    Returns:
      A list of ``jax.Device``.
    """
    if execution_environment == "cpu":
        devices = jax.local_devices(backend="cpu")
    elif execution_environment == "auto":
        devices = jax.local_devices()
    else:
        try:
            devices = jax.local_devices(backend="gpu")
        except RuntimeError:
            devices = []
        if not devices:
            raise RuntimeError(f'execution_environment="{execution_environment}" needs a GPU but '
                               f'JAX sees only {jax.local_devices()}; install jaxflowers[cuda12] '
                               'or use "auto"/"cpu"')
        if execution_environment == "gpu":
            devices = devices[:1]
    if num_devices is not None:
        if not 1 <= num_devices <= len(devices):
            raise ValueError(f"num_devices={num_devices} is outside 1..{len(devices)}, the "
                             f"devices available for execution_environment="
                             f'"{execution_environment}"')
        devices = devices[:num_devices]
    return list(devices)


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """Runs per-device functions on every device of a 1-D ``"data"`` mesh.

    Arrays are described by ``PartitionSpec``s: ``REPLICATED`` (every device holds the whole
    array) or ``sharded(axis)`` (each device holds 1/N of dimension ``axis``). Inside the
    wrapped function every argument has its per-device shape under both strategies.
    """

    devices: tuple
    strategy: str = "shard_map"

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r} is not one of {STRATEGIES}")
        object.__setattr__(self, "devices", tuple(self.devices))

    @functools.cached_property
    def mesh(self) -> Mesh:
        return Mesh(np.asarray(self.devices), (AXIS,))

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def put(self, tree, spec: P = REPLICATED):
        """Place host or device arrays on the devices in the layout ``wrap`` expects."""
        return jax.tree.map(lambda x: self._put_one(x, spec), tree)

    def get(self, tree, spec: P = REPLICATED):
        """Bring arrays placed with ``put`` (or returned by a wrapped function) to numpy."""
        return jax.tree.map(lambda x: self._get_one(x, spec), tree)

    def wrap(self, fn: Callable, in_specs: Sequence[Any], out_specs: Any,
             donate_argnums: Sequence[int] = ()) -> Callable:
        """Compile ``fn`` (a per-device function using axis ``"data"``) for all devices.

        ``in_specs`` has one spec (or pytree prefix of specs) per positional argument.
        Gradients are not summed implicitly: ``check_vma=False`` makes ``shard_map`` behave
        as ``pmap`` does, so the step's explicit ``pmean``s are the only collectives and the
        gradient is averaged exactly once under both strategies.
        """
        if self.strategy == "pmap":
            return jax.pmap(fn, axis_name=AXIS, devices=self.devices,
                            donate_argnums=tuple(donate_argnums))
        mapped = jax.shard_map(fn, mesh=self.mesh, in_specs=tuple(in_specs),
                               out_specs=out_specs, check_vma=False)
        return jax.jit(mapped, donate_argnums=tuple(donate_argnums))

    def _put_one(self, x, spec: P):
        axis = _shard_axis(spec)
        if self.strategy == "shard_map":
            return jax.device_put(x, NamedSharding(self.mesh, spec))
        # pmap wants the device axis first: replicas stacked, shards split out of `axis`.
        x = np.asarray(x)
        if axis is None:
            x = np.broadcast_to(x, (self.num_devices, *x.shape))
        else:
            x = np.moveaxis(_split_axis(x, axis, self.num_devices), axis, 0)
        return jax.device_put(x, NamedSharding(self.mesh, sharded(0)))

    def _get_one(self, x, spec: P):
        axis = _shard_axis(spec)
        if self.strategy == "shard_map":
            return np.asarray(jax.device_get(x))
        x = np.asarray(jax.device_get(x[0] if axis is None else x))
        if axis is None:
            return x
        x = np.moveaxis(x, 0, axis)
        return x.reshape(*x.shape[:axis], -1, *x.shape[axis + 2:])


def _split_axis(x: np.ndarray, axis: int, parts: int) -> np.ndarray:
    if x.shape[axis] % parts:
        raise ValueError(f"dimension {axis} of shape {x.shape} does not split into {parts} "
                         "equal parts")
    return x.reshape(*x.shape[:axis], parts, x.shape[axis] // parts, *x.shape[axis + 1:])
