"""``train_job``: the job function of a training sweep (MATLAB: ``trainnet`` in ``parfeval``).

It runs in a worker; JAX is imported inside the functions, never by importing this module.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any, Mapping

from jaxflowers import recipes  # imports no JAX
from jaxflowers.sweep.channel import launched, mark, print_times, ready, report, warm_since

__all__ = ["job_options", "train_job"]


def train_job(*, data, model, options, execution=None, seed: int | None = None):
    """Train one network, reporting its ``output_fn`` messages (MATLAB: ``trainnet`` in parfeval).

    Args:
      data: a data spec or plan (``recipes.load_plan``); its training and validation sets are used.
      model: a model spec (``recipes.build_model``); ``num_classes`` defaults to the data's.
      options: a dict of ``TrainingOptions`` fields (``ExecutionOptions`` fields go to
        ``execution``) or a ``TrainingOptions``; ``plots`` becomes "none".
      execution: ``ExecutionOptions`` or a dict of its fields; None: the defaults.
      seed: overrides ``options["seed"]``.

    Returns:
      ``(net, info)`` as ``jaxflowers.train`` returns them, rebuilt by ``Future.result()``. A
      diverged run returns them too, after a last message ``{"state": "failed", "error": ...}``.
    """
    start_up = _StartUp()
    import jax

    # why a thread: starting the GPU backend (seconds) overlaps the imports and the data
    with concurrent.futures.ThreadPoolExecutor(1, "jaxflowers-backend") as pool:
        devices = pool.submit(jax.devices)
        from jaxflowers.compilation.cache import enable_compilation_cache
        from jaxflowers.training.run import train  # whether or not jaxflowers/__init__ is lazy

        start_up.mark("imports")
        enable_compilation_cache()  # a job repeating an earlier one's shapes loads its programs
        train_set, validation_set, _ = recipes.load_plan(data)
        listed = getattr(train_set, "listed_from", None)  # the caller's scan, not repeated
        start_up.mark("data listed by the caller" if listed else "data")
        devices.result()  # raises what starting the backend raised
        start_up.mark("JAX's devices")
    module = recipes.build_model(model, num_classes=len(train_set.class_names))
    options, execution = _options(options, execution, seed, validation_set, start_up)
    net, info = train(train_set, module, options, execution=execution)
    if info.diverged:
        report({"state": "failed", "error": info.stop_reason})
    return net, info


class _StartUp:
    """When a job's start-up steps ended, in seconds after its worker got it (launched with
    it, or handed it warm), or after ``train_job`` began outside a pool: one line in its log.
    A warm worker's line begins with when it was launched and when it had imported JAX
    (negative: before the job came)."""

    def __init__(self):
        self.origin = launched() or time.time()
        self.marks: dict[str, float] = {}
        if (worker_launched := warm_since()) is not None:
            self.marks["worker launched"] = worker_launched - self.origin
        if (worker_ready := ready()) is not None:
            self.marks["worker ready"] = worker_ready - self.origin
        self.marks["job function"] = time.time() - self.origin

    def mark(self, name: str) -> None:
        self.marks[name] = time.time() - self.origin

    def print(self) -> None:
        print_times("Start-up", self.marks)


class _SendToPool:
    """``output_fn`` of a sweep job: send every message to the pool, never stop. The first
    "iteration" message also carries the device memory the training takes, from which
    ``DevicePool(jobs_per_device="auto")`` decides how many jobs fit on the GPU."""

    def __init__(self, start_up: _StartUp | None = None):
        self.measured, self.start_up = False, start_up

    def __call__(self, message: dict) -> bool:
        state = message.get("state")
        if state == "done":  # after the population pass and the final validation
            mark("network returned")
        elif state == "iteration":  # the last one comes with the last step
            mark("last step")
        if state == "iteration" and not self.measured:
            self.measured = True
            if self.start_up is not None:
                self.start_up.mark("first step")
                self.start_up.print()
            memory = _device_memory()
            if memory:
                message = {**message, "device_memory": memory}
        report(message)
        return False


def _device_memory() -> dict | None:
    """``{"peak": bytes, "limit": bytes}`` of this process's first device, None on CPUs."""
    import jax

    try:
        stats = jax.local_devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 (backends without statistics raise)
        return None
    if "peak_bytes_in_use" not in stats or "bytes_limit" not in stats:
        return None
    return {"peak": int(stats["peak_bytes_in_use"]), "limit": int(stats["bytes_limit"])}


def job_options(options, execution=None) -> tuple[Any, Any]:
    """``(TrainingOptions, ExecutionOptions)`` of a job's ``options`` and ``execution`` (dicts or
    instances; execution fields in ``options`` go to the second), without JAX. ValueError names
    an unknown option or a bad value; TypeError, a wrong type."""
    from jaxflowers.options import ExecutionOptions, TrainingOptions

    fields = _fields(options, TrainingOptions, "options")
    routed = {f.name: fields.pop(f.name) for f in dataclasses.fields(ExecutionOptions)
              if f.name in fields}
    known = [f.name for f in dataclasses.fields(TrainingOptions)]
    unknown = [name for name in fields if name not in known]
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}: neither TrainingOptions nor "
                         f"ExecutionOptions has such a field (TrainingOptions: "
                         f"{', '.join(known)})")
    execution = {**_fields(execution or {}, ExecutionOptions, "execution"), **routed}
    return TrainingOptions.from_dict(fields), ExecutionOptions.from_dict(execution)


def _fields(value, cls, what: str) -> dict:
    """The init fields of a ``cls`` instance or a dict of them, as a new dict."""
    if isinstance(value, cls):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{what} must be a dict of {cls.__name__} fields or a {cls.__name__}, "
                    f"not {type(value).__name__}")


def _options(options, execution, seed: int | None, validation_set, start_up=None):
    options, execution = job_options(options, execution)
    # plots "none": plots.sweep_progress(pool) draws the jobs' figures
    changes = {"output_fn": _SendToPool(start_up), "plots": "none"}
    if seed is not None:
        changes["seed"] = seed
    if validation_set is not None:
        changes["validation_data"] = validation_set
    return options.replace(**changes), execution
