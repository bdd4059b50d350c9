"""What a sweep job costs besides its own work: python benchmarks/sweep_overhead.py

Measures, on the machine at hand (CPU slots without a GPU):
  * start-up: submit() -> the job function's first line, for one job at a time;
  * round trip: submit() -> result() of a job that does nothing;
  * JAX ready: submit() -> the job has imported JAX and run a first computation on its
    slot (the GPU pinned by CUDA_VISIBLE_DEVICES, or the CPU);
  * cancel -> reuse: cancel() of a running job -> the next queued job's worker is spawned
    (slot handed over) and -> that job's function starts;
  * for reference, a bare interpreter and ``import jaxflowers.sweep.backends.worker`` (what every
    worker pays before the job's own imports).
One warm-up job runs first (page cache, .pyc files). Reports medians of the repeats and
writes every raw number to JSON (default runs/sweep_overhead.json).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import threading
import time

from jaxflowers import sweep


def started() -> float:
    """Job: the wall-clock time its function began (same machine, same clock)."""
    return time.time()


def jax_ready() -> float:
    """Job: the wall-clock time its slot's JAX backend had run a first computation."""
    import jax.numpy as jnp

    jnp.zeros(4).block_until_ready()
    return time.time()


def sleeper(seconds: float) -> None:
    """Job: report that it runs, then sleep."""
    sweep.report({"running": time.time()})
    time.sleep(seconds)


def startup_and_round_trip(pool, repeats: int) -> dict:
    """One job at a time: submit -> function start, submit -> result, submit -> JAX ready."""
    startup, round_trip, jax_startup = [], [], []
    for _ in range(repeats):
        t0 = time.time()
        begin = pool.submit(started).result()
        round_trip.append(time.time() - t0)
        startup.append(begin - t0)
        t0 = time.time()
        jax_startup.append(pool.submit(jax_ready).result() - t0)
    return {"startup_s": startup, "round_trip_s": round_trip, "jax_ready_s": jax_startup}


def cancel_to_reuse(pool, repeats: int) -> dict:
    """Fill every slot with sleepers, queue one more job, cancel one sleeper: how long until
    the queued job's worker is spawned, and until its function runs?"""
    handed_over, function_started, running = [], [], set()
    changed = threading.Condition()

    @pool.after_each
    def note(job_index, message):
        with changed:
            running.add(job_index)
            changed.notify_all()

    for _ in range(repeats):
        sleepers = [pool.submit(sleeper, 60) for _ in range(pool.num_slots)]
        with changed:
            changed.wait_for(lambda s=sleepers: all(f.job_index in running for f in s), 120)
        queued = pool.submit(started)
        t0 = time.time()
        sleepers[0].cancel()
        while not queued.running():
            time.sleep(0.0005)
        handed_over.append(time.time() - t0)
        function_started.append(queued.result() - t0)
        for future in sleepers:
            future.cancel()
    return {"cancel_to_spawn_s": handed_over, "cancel_to_function_s": function_started}


def interpreter_costs(repeats: int) -> dict:
    """Seconds for `python -c pass` and for importing the worker module."""
    costs = {}
    for name, code in (("python_s", "pass"),
                       ("import_worker_s", "import jaxflowers.sweep.backends.worker")):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            times.append(time.perf_counter() - t0)
        costs[name] = times
    return costs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", default="local", choices=("local", "ray"))
    parser.add_argument("--out", default="runs/sweep_overhead.json")
    args = parser.parse_args(argv)
    with sweep.DevicePool(args.slots, backend=args.backend) as pool:
        pool.submit(started).result()  # warm-up
        raw = {**startup_and_round_trip(pool, args.repeats),
               **cancel_to_reuse(pool, max(1, args.repeats // 2))}
    raw.update(interpreter_costs(3))
    record = {"backend": args.backend, "slots": args.slots, "cpu_count": os.cpu_count(),
              "machine": platform.processor() or platform.machine(),
              "python": platform.python_version(), "raw": raw,
              "median": {k: statistics.median(v) for k, v in raw.items()}}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(f"sweep overhead, backend={args.backend}, {args.slots} slots, "
          f"{os.cpu_count()} CPUs (median of repeats, seconds)")
    for key, value in record["median"].items():
        spread = f"[{min(raw[key]):.3f} .. {max(raw[key]):.3f}]"
        print(f"  {key:24s} {value:8.3f}  {spread}")
    print(f"raw numbers: {out}")


if __name__ == "__main__":
    main()
