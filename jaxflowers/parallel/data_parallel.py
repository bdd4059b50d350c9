"""Device meshes and the wrapping of per-device functions.

A per-device function knows only the axis name ``"data"``. :class:`DataParallel` runs it on
every device of a 1-D mesh through ``jax.shard_map`` (default) or ``jax.pmap``, and moves
arrays into the layout each strategy expects. Nothing else in the package builds a mesh or
calls ``shard_map``/``pmap``; the programs that use it are ``program.TrainProgram``'s and
``forward.ForwardPass``'s.

Several processes (hosts). After ``jaxflowers.distributed.initialize`` (``jax.distributed``),
the mesh spans
the devices of every process, ordered process by process, and each process runs the same
program on its own devices (JAX's multi-controller model). Every process holds the same
host data and the same seeded plan (``feed.epoch_order``), so:

* ``put`` builds a global array from the host copy each process has
  (``jax.make_array_from_callback``: each process fills only its own devices; a plain
  ``device_put`` onto devices of other processes fails);
* ``put_process_local`` builds one from this process's rows only
  (``jax.make_array_from_process_local_data``), for streamed batches of which each process
  reads just its columns;
* ``get`` reads a replicated value from a local copy and gathers a sharded one from all
  processes (``process_allgather``: a collective every process must call), so metrics,
  validation and prediction are global and exact.

Inside ``shard_map`` over the global mesh, ``lax.axis_index("data")`` is the global device
index, so per-sample augmentation keys (``step.sample_keys``) are the same as on one host.
``pmap`` is single-process only here. The single-process path is unchanged: plain
``device_put``/``device_get``.
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

AXIS = "data"
REPLICATED = P()


def sharded(axis: int = 0) -> P:
    """The spec of an array split over the devices along ``axis``."""
    return P(*([None] * axis), AXIS)


def _shard_axis(spec: P) -> int | None:
    """Index of the dimension ``spec`` splits over the mesh, or None when replicated."""
    return next((i for i, name in enumerate(spec) if name == AXIS), None)


def select_devices(execution_environment: str = "auto", num_devices: int | None = None):
    """The devices a training uses (MATLAB's ``ExecutionEnvironment``).

    With several processes the rule picks devices on every process alike and the result
    holds them all, process by process (the global mesh); ``num_devices`` then counts per
    process.

    Args:
      execution_environment: "auto" (every GPU if there is one, else the CPU devices),
        "cpu", "gpu" (one GPU per process) or "multi-gpu" (every GPU).
      num_devices: keep only the first ``num_devices`` of each process's devices.

    Returns:
      A list of ``jax.Device``.
    """
    count = 1 if execution_environment == "gpu" else num_devices
    return _by_process(_environment_devices(execution_environment), count, execution_environment)


def _environment_devices(execution_environment: str) -> list:
    """Every device (of every process) of the environment's backend."""
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
    """The first ``count`` (default all) devices of each process, process by process: the
    mesh order in which process p's devices hold the p-th share of a sharded axis."""
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

    Arrays are described by ``PartitionSpec``s: ``REPLICATED`` (every device holds the whole
    array) or ``sharded(axis)`` (each device holds 1/N of dimension ``axis``). Inside the
    wrapped function every argument has its per-device shape under both strategies. When
    the devices span several processes, every process must make the same calls in the
    same order (``put``, ``get`` of sharded values and wrapped functions are collective).
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
        """The devices of this process."""
        return tuple(d for d in self.devices if d.process_index == jax.process_index())

    @functools.cached_property
    def lockstep(self) -> bool:
        """Whether each wrapped call must finish before the next one starts.

        XLA:CPU's collectives hang when a process with several CPU devices has more than
        one execution in flight: across processes (gloo), and in one process too once the
        devices outnumber the host's threads (a device's part of a queued collective never
        starts, and the others abort at XLA's rendezvous timeout). One device, or a wait
        after each call, runs. GPUs (NCCL streams) queue freely.
        """
        return self.devices[0].platform == "cpu" and len(self.local_devices) > 1

    @property
    def is_main_process(self) -> bool:
        """Whether this process prints, plots and writes files (process 0 does)."""
        return jax.process_index() == min(d.process_index for d in self.devices)

    def put(self, tree, spec: P = REPLICATED):
        """Place host or device arrays on the devices in the layout ``wrap`` expects.

        With several processes every process passes the same (global) values."""
        return jax.tree.map(lambda x: self._put_one(x, spec), tree)

    def abstract(self, tree, spec: P = REPLICATED):
        """``jax.ShapeDtypeStruct``s of what ``put(tree, spec)`` would place, to compile a
        function before its arguments exist (or have reached the devices)."""
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

    def put_process_local(self, tree, spec: P = sharded(0)):
        """Place this process's share of arrays split along ``spec``'s axis.

        Each process passes its consecutive 1/P of the rows (P processes, in process order,
        as ``stream.process_columns`` cuts them); one process: the same as ``put``."""
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
        """Bring arrays placed with ``put`` (or returned by a wrapped function) to numpy.

        With several processes, a sharded ``spec`` gathers from every process (a collective:
        all processes call it); every process receives the whole array."""
        return jax.tree.map(lambda x: self._get_one(x, spec), tree)

    def from_main_process(self, value):
        """Process 0's ``value`` (a numpy-compatible pytree) on every process.

        Keeps choices that every process must make alike (stop early, resident or streamed)
        from diverging, which would leave processes waiting in different collectives."""
        if not self.multiprocess:
            return value
        from jax.experimental import multihost_utils
        return jax.tree.map(lambda x: x.item() if x.ndim == 0 else x,
                            multihost_utils.broadcast_one_to_all(value))

    def any_process(self, bits: int) -> int:
        """The bitwise OR of ``bits`` (a small non-negative int) over every process, so a
        flag raised in any process (a signal) reaches all of them at the same point."""
        if not self.multiprocess:
            return int(bits)
        from jax.experimental import multihost_utils
        gathered = multihost_utils.process_allgather(np.int32(bits))
        return int(np.bitwise_or.reduce(np.asarray(gathered).reshape(-1)))

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
