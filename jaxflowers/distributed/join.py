"""Joining a multi-process (multi-host) training: ``jax.distributed`` start-up.

Every process runs the same program; :func:`initialize` joins them before anything else
touches JAX. Failures are said in one line each: a bad or missing setting names the
flag or variable, and a process that never joins or is lost is named (``checkin.py``).
On CPUs the processes talk through Gloo, which prints one "[Gloo] Rank ... is connected"
line per device from C++; it has no switch to turn them off, so they are let through.
"""
from __future__ import annotations

import os
from typing import Sequence

from jaxflowers.distributed import checkin as roster

# Environment variables `initialize` reads for a plain (non-Slurm/MPI/Kubernetes) launch.
COORDINATOR_ENV = "JAXFLOWERS_COORDINATOR"  # HOST:PORT of process 0
NUM_PROCESSES_ENV = "JAXFLOWERS_NUM_PROCESSES"
PROCESS_ID_ENV = "JAXFLOWERS_PROCESS_ID"
DEFAULT_INIT_TIMEOUT = 120  # seconds every process waits for all the others to join


class DistributedError(RuntimeError):
    """The processes could not be joined; the message (one line) says why."""


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, local_device_ids: Sequence[int] | None = None,
               heartbeat_timeout_seconds: int = 30,
               initialization_timeout: float = DEFAULT_INIT_TIMEOUT) -> None:
    """Join a multi-process (multi-host) training: ``jax.distributed.initialize``.

    Call it first, in every process, before anything else touches JAX. With no arguments
    and none of the variables below set, JAX detects Slurm, Open MPI and Kubernetes
    launches itself. A plain launch names the coordinator and the processes, as arguments
    or as ``$JAXFLOWERS_COORDINATOR`` (``HOST:PORT`` of process 0, reachable from every
    host), ``$JAXFLOWERS_NUM_PROCESSES`` and ``$JAXFLOWERS_PROCESS_ID`` (0 .. N-1); then
    every process first checks in with process 0, and a process that never joins or is
    lost later is named in one line (``jaxflowers.distributed.checkin``).

    Args:
      coordinator_address: ``"HOST:PORT"``; process 0 listens there.
      num_processes: how many processes take part.
      process_id: this process, ``0 <= process_id < num_processes``.
      local_device_ids: the local GPUs this process uses (default: JAX's choice).
      heartbeat_timeout_seconds: a process silent this long counts as lost in JAX (a
        process that dies is noticed at once by the check-in connections).
      initialization_timeout: seconds to wait for every process to join (JAX's default,
        300 s, leaves the others silent that long when one never starts).

    Raises:
      ValueError: a setting is missing, malformed or out of range (named).
      DistributedError: the processes could not be joined (the line says which and why).
      RuntimeError: when called twice, or after JAX has started its backends (anything
        such as ``jax.devices()``, an array, a computation, ``jaxflowers.train``).
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
    # Cross-process collectives on CPU need an implementation; JAX < 0.5 had none by default.
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
    """The three settings from the arguments or the environment, checked together.

    Returns:
      ``(address, count, index)``, all None when none is set (JAX then detects a
      cluster), else all three.

    Raises:
      ValueError: naming the setting that is missing, malformed or out of range.
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
