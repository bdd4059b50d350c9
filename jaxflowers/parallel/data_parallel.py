"""Device meshes and the one wrapping of per-device functions (``shard_map`` or ``pmap``).

Nothing else builds a mesh or calls ``shard_map``/``pmap``. The mesh spans every process's
devices, process by process; every process makes the same calls, in the same order.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxflowers.compilation.options import compiler_options
from jaxflowers.options.execution import STRATEGIES

__all__ = ["AXIS", "DataParallel", "REPLICATED", "select_devices", "sharded"]

AXIS = "data"
REPLICATED = P()


def sharded(axis: int = 0) -> P:
    """The spec of an array split over the devices along ``axis``."""
    return P(*([None] * axis), AXIS)


def _shard_axis(spec: P) -> int | None:
    """Index of the dimension ``spec`` splits over the mesh, or None when replicated."""
    return next((i for i, name in enumerate(spec) if name == AXIS), None)


def select_devices(execution_environment: str = "auto", num_devices: int | None = None):
    """Every process's devices a training uses, in mesh order (MATLAB's ``ExecutionEnvironment``).

    Args:
      execution_environment: "auto" (every GPU, else the CPU devices), "cpu", "gpu" (one GPU
        per process) or "multi-gpu".
      num_devices: keep the first ``num_devices`` of each process's devices.
    """
    count = 1 if execution_environment == "gpu" else num_devices
    return _by_process(_environment_devices(execution_environment), count, execution_environment)


def _environment_devices(execution_environment: str) -> list:
    if execution_environment == "cpu":
        return jax.devices("cpu")
    if execution_environment == "auto":
        return jax.devices()
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        devices = []
    if not devices:
        raise RuntimeError(f'execution_environment="{execution_environment}" needs a GPU but '
                           f'JAX sees only {jax.local_devices()}; install jaxflowers[cuda12] '
                           'or use "auto"/"cpu"')
    return devices


def _by_process(devices, count: int | None, execution_environment: str) -> list:
    """The first ``count`` (default all) devices of each process, in mesh order."""
    processes = sorted({d.process_index for d in devices})
    local = [[d for d in devices if d.process_index == p] for p in processes]
    available = min(len(group) for group in local)
    if count is not None and not 1 <= count <= available:
        raise ValueError(f"num_devices={count} is outside 1..{available}, the devices "
                         f'available per process for execution_environment='
                         f'"{execution_environment}"')
    return [d for group in local for d in group[:count]]


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """Runs per-device functions on every device of a 1-D ``"data"`` mesh.

    Layouts: ``REPLICATED`` or ``sharded(axis)``; a wrapped function sees per-device shapes.
    ``strategy`` is "shard_map" or "pmap" (one process only).
    """

    devices: tuple
    strategy: str = "shard_map"

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r} is not one of {STRATEGIES}")
        object.__setattr__(self, "devices", tuple(self.devices))
        if self.strategy == "pmap" and self.multiprocess:
            raise ValueError(f'strategy="pmap" runs on one process only, but these devices '
                             f"belong to {self.process_count} processes; use \"shard_map\"")

    @functools.cached_property
    def mesh(self) -> Mesh:
        return Mesh(np.asarray(self.devices), (AXIS,))

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @functools.cached_property
    def process_count(self) -> int:
        """How many processes own the devices (1 without ``initialize``)."""
        return len({d.process_index for d in self.devices})

    @property
    def multiprocess(self) -> bool:
        return self.process_count > 1

    @property
    def local_devices(self) -> tuple:
        return tuple(d for d in self.devices if d.process_index == jax.process_index())

    @functools.cached_property
    def lockstep(self) -> bool:
        """Whether each wrapped call must finish before the next one starts."""
        # why: XLA:CPU collectives hang with several CPU devices and more than one execution
        # in flight (gloo across processes; in one process once devices outnumber threads).
        return self.devices[0].platform == "cpu" and len(self.local_devices) > 1

    @property
    def is_main_process(self) -> bool:
        """Whether this process prints, plots and writes files (process 0 does)."""
        return jax.process_index() == min(d.process_index for d in self.devices)

    def put(self, tree, spec: P = REPLICATED):
        """Place a pytree of arrays in the layout ``spec``; every process passes the same values."""
        return jax.tree.map(lambda x: self._put_one(x, spec), tree)

    def abstract(self, tree, spec: P = REPLICATED):
        """``jax.ShapeDtypeStruct``s of what ``put(tree, spec)`` would place (to compile early)."""
        axis = _shard_axis(spec)

        def one(x):
            if self.strategy == "shard_map":
                return jax.ShapeDtypeStruct(x.shape, x.dtype,
                                            sharding=NamedSharding(self.mesh, spec))
            shape = list(x.shape)  # pmap: the device axis first, as `put` stacks or splits
            if axis is not None:
                shape[axis] //= self.num_devices
            return jax.ShapeDtypeStruct((self.num_devices, *shape), x.dtype,
                                        sharding=NamedSharding(self.mesh, sharded(0)))

        return jax.tree.map(one, tree)

    def put_process_local(self, tree, spec: P | None = None):
        """Place arrays of which each process passes its consecutive 1/P of ``spec``'s axis
        (default: the first)."""
        spec = sharded(0) if spec is None else spec
        if not self.multiprocess:
            return self.put(tree, spec)
        sharding, axis = NamedSharding(self.mesh, spec), _shard_axis(spec)

        def one(x):
            x = np.asarray(x)
            shape = list(x.shape)
            shape[axis] *= self.process_count
            return jax.make_array_from_process_local_data(sharding, x, tuple(shape))

        return jax.tree.map(one, tree)

    def get(self, tree, spec: P = REPLICATED):
        """Numpy copies of device arrays; a sharded ``spec`` gathers from every process."""
        return jax.tree.map(lambda x: self._get_one(x, spec), tree)

    def from_main_process(self, value):
        """Process 0's ``value`` (a numpy pytree) on every process, so choices cannot diverge."""
        if not self.multiprocess:
            return value
        from jax.experimental import multihost_utils
        return jax.tree.map(lambda x: x.item() if x.ndim == 0 else x,
                            multihost_utils.broadcast_one_to_all(value))

    def any_process(self, bits: int) -> int:
        """The bitwise OR of ``bits`` (a small non-negative int) over every process."""
        if not self.multiprocess:
            return int(bits)
        from jax.experimental import multihost_utils
        gathered = multihost_utils.process_allgather(np.int32(bits))
        return int(np.bitwise_or.reduce(np.asarray(gathered).reshape(-1)))

    def wrap(self, fn: Callable, in_specs: Sequence[Any], out_specs: Any,
             donate_argnums: Sequence[int] = ()) -> Callable:
        """Compile ``fn``, a per-device function using axis ``"data"``, for all devices.

        Args:
          in_specs: one spec (or pytree prefix) per positional argument; out_specs: the outputs'.
          donate_argnums: arguments whose buffers the call may reuse.
        """
        if self.strategy == "pmap":
            return jax.pmap(fn, axis_name=AXIS, devices=self.devices,
                            donate_argnums=tuple(donate_argnums))
        # why check_vma=False: as in pmap, the step's explicit pmeans are the only collectives.
        mapped = jax.shard_map(fn, mesh=self.mesh, in_specs=tuple(in_specs),
                               out_specs=out_specs, check_vma=False)
        jitted = jax.jit(mapped, donate_argnums=tuple(donate_argnums),
                         compiler_options=compiler_options())
        return _Lockstep(jitted) if self.lockstep else jitted

    def _put_one(self, x, spec: P):
        axis = _shard_axis(spec)
        if self.strategy == "shard_map":
            if self.multiprocess:
                # Each process fills its own devices from its copy of the global value.
                host = np.asarray(x)
                return jax.make_array_from_callback(host.shape, NamedSharding(self.mesh, spec),
                                                    lambda index: host[index])
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
            if self.multiprocess and isinstance(x, jax.Array):
                return _get_global(x, axis)
            return np.asarray(jax.device_get(x))
        x = np.asarray(jax.device_get(x[0] if axis is None else x))
        if axis is None:
            return x
        x = np.moveaxis(x, 0, axis)
        return x.reshape(*x.shape[:axis], -1, *x.shape[axis + 2:])


class _Lockstep:
    """A jitted (or lowered, or compiled) function whose calls wait for their results."""

    def __init__(self, fn):
        self._fn = fn

    def __call__(self, *args):
        return jax.block_until_ready(self._fn(*args))

    def lower(self, *args):
        return _Lockstep(self._fn.lower(*args))

    def compile(self):
        return _Lockstep(self._fn.compile())


def _get_global(x: jax.Array, axis: int | None) -> np.ndarray:
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    if axis is None:
        return np.asarray(x.addressable_data(0))  # every device holds the whole value
    from jax.experimental import multihost_utils
    # One all-gather over every process's devices; each process gets the whole array.
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _split_axis(x: np.ndarray, axis: int, parts: int) -> np.ndarray:
    if x.shape[axis] % parts:
        raise ValueError(f"dimension {axis} of shape {x.shape} does not split into {parts} "
                         "equal parts")
    return x.reshape(*x.shape[:axis], parts, x.shape[axis] // parts, *x.shape[axis + 1:])
