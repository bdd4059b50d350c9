"""Joining a multi-process (multi-host) training (``jax.distributed``), each failure in one line."""
from __future__ import annotations

import os
from typing import Sequence

from jaxflowers.distributed import checkin as roster

__all__ = ["COORDINATOR_ENV", "DEFAULT_INIT_TIMEOUT", "DistributedError", "NUM_PROCESSES_ENV",
           "PROCESS_ID_ENV", "initialize", "resolve"]

# Environment variables `initialize` reads for a plain (non-Slurm/MPI/Kubernetes) launch.
COORDINATOR_ENV = "JAXFLOWERS_COORDINATOR"  # HOST:PORT of process 0
NUM_PROCESSES_ENV = "JAXFLOWERS_NUM_PROCESSES"
PROCESS_ID_ENV = "JAXFLOWERS_PROCESS_ID"
DEFAULT_INIT_TIMEOUT = 120  # seconds to wait for all to join (JAX's default is long and silent)


class DistributedError(RuntimeError):
    """The processes could not be joined; the message (one line) says why."""


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, local_device_ids: Sequence[int] | None = None,
               heartbeat_timeout_seconds: int = 30,
               initialization_timeout: float = DEFAULT_INIT_TIMEOUT) -> None:
    """Join a multi-process (multi-host) training (``jax.distributed.initialize``); call it first.

    With nothing given or set, JAX detects Slurm, Open MPI and Kubernetes.

    Args:
      coordinator_address: "HOST:PORT" of process 0 (or ``$JAXFLOWERS_COORDINATOR``).
      num_processes, process_id: or ``$JAXFLOWERS_NUM_PROCESSES``, ``$JAXFLOWERS_PROCESS_ID``.
      local_device_ids: the local GPUs this process uses (default: JAX's choice).
      heartbeat_timeout_seconds: a silent process is lost after this many seconds.
      initialization_timeout: seconds to wait for every process to join.

    Raises:
      ValueError: a setting is missing, malformed or out of range (named).
      DistributedError: the processes could not be joined (the line says which and why).
      RuntimeError: when called twice, or after JAX has started its backends.
    """
    import jax

    if not initialization_timeout > 0:
        raise ValueError(f"initialization_timeout (--init-timeout) {initialization_timeout!r} "
                         "must be a positive number of seconds")
    address, count, index = resolve(coordinator_address, num_processes, process_id)
    _check_not_started(jax)
    watch = None
    if address is not None:  # a plain launch: check in first, then JAX
        try:
            watch = roster.check_in(address, count, index, initialization_timeout)
        except roster.JoinError as error:
            raise DistributedError(str(error)) from None
    # why: cross-process collectives on CPU need an implementation, and some JAX sets none.
    if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(address, count, index, local_device_ids=local_device_ids,
                                   heartbeat_timeout_seconds=heartbeat_timeout_seconds,
                                   initialization_timeout=int(initialization_timeout))
    except ValueError as error:  # JAX found no cluster to detect
        raise DistributedError(
            f"no cluster found to join ({error}): under Slurm, Open MPI or Kubernetes their "
            f"variables say where; else give --coordinator, --num-processes and --process-id "
            f"(or ${COORDINATOR_ENV}, ${NUM_PROCESSES_ENV}, ${PROCESS_ID_ENV})") from None
    if watch is not None:
        watch.start()


def resolve(coordinator_address: str | None, num_processes: int | None,
            process_id: int | None) -> tuple[str | None, int | None, int | None]:
    """``(address, count, index)`` from arguments or environment: all None or all three, checked.

    Raises ValueError naming a setting that is missing, malformed or out of range.
    """
    address = coordinator_address or os.environ.get(COORDINATOR_ENV) or None
    count = _env_int(num_processes, NUM_PROCESSES_ENV)
    index = _env_int(process_id, PROCESS_ID_ENV)
    given = {"--coordinator": address, "--num-processes": count, "--process-id": index}
    if all(value is None for value in given.values()):
        return None, None, None
    missing = [flag for flag, value in given.items() if value is None]
    if missing:
        raise ValueError(f"{', '.join(missing)} missing: a plain launch needs --coordinator, "
                         "--num-processes and --process-id (or their $JAXFLOWERS_ variables)")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--coordinator {address!r} must be HOST:PORT, e.g. 10.0.0.1:1234")
    if count < 1:
        raise ValueError(f"--num-processes {count} must be at least 1")
    if not 0 <= index < count:
        raise ValueError(f"--process-id {index} must lie in 0..{count - 1} "
                         f"(--num-processes {count})")
    return address, count, index


def _env_int(value: int | None, name: str) -> int | None:
    if value is not None or not os.environ.get(name):
        return value
    try:
        return int(os.environ[name])
    except ValueError:
        raise ValueError(f"${name}={os.environ[name]!r} is not an integer") from None


def _check_not_started(jax) -> None:
    is_initialized = getattr(jax.distributed, "is_initialized", None)
    if is_initialized is not None and is_initialized():
        raise RuntimeError("jaxflowers.distributed.initialize was already called in this "
                           "process (jax.distributed is initialised); call it once")
    try:
        from jax._src.xla_bridge import backends_are_initialized  # no public equivalent
    except ImportError:
        return  # jax.distributed.initialize still refuses, in its own words
    if backends_are_initialized():
        raise RuntimeError("jaxflowers.distributed.initialize must run before anything starts "
                           "JAX's backends (jax.devices(), creating an array, a computation, "
                           "jaxflowers.train); call it first thing in every process")
