"""What a second process costs: python benchmarks/multihost_cpu.py

Trains cifar_net(1) on the embedded digits (32x32x3, sync batch norm unless
--no-sync-batch-norm, augmentation,
resident data) with the same global batch two ways on this machine's CPU:
  * 1 process x 4 fake CPU devices (collectives inside one process);
  * 2 processes x 2 fake CPU devices each, joined by ``jax.distributed`` on 127.0.0.1
    (gradient all-reduce across processes through gloo over TCP).
Per-step time is ``TrainingInfo.train_time`` over the iterations (compile excluded; the
loop ends with ``block_until_ready``), median of ``--repeats`` trainings in one process.
Also the wall time of each whole run (start-up, compile, training). Raw numbers go to
JSON (default runs/multihost_cpu.json).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(args) -> None:
    """One process: train ``--repeats`` times, print the per-step times as JSON (process 0)."""
    from jaxflowers import distributed
    if os.environ.get(distributed.COORDINATOR_ENV):
        distributed.initialize()
    import jax
    import numpy as np

    import jaxflowers as jf

    data = jf.data.digits()
    opts = jf.TrainingOptions(
        solver="sgdm", mini_batch_size=args.batch, max_epochs=args.epochs, verbose=False,
        augmentation=jf.data.Augmentation(reflect_x=True, translate_x=(-4, 4)))
    execution = jf.ExecutionOptions(sync_batch_norm=not args.no_sync_batch_norm)
    steps, compile_s = [], []
    for _ in range(args.repeats):
        _, info = jf.train(data, jf.models.cifar_net(1, num_classes=10), opts,
                           execution=execution)
        steps.append(info.train_time / len(info.loss))
        compile_s.append(info.compile_time)
    if jax.process_index() == 0:
        print(json.dumps({"step_s": steps, "compile_s": compile_s,
                          "iterations": int(len(info.loss)), "devices": info.num_devices,
                          "processes": jax.process_count(), "jax": jax.__version__,
                          "device_kind": jax.devices()[0].device_kind,
                          "batch_per_device": args.batch // info.num_devices,
                          "checksum": float(np.sum(info.loss))}))


def run(processes: int, devices_each: int, args) -> dict:
    """Start ``processes`` workers, wait, return process 0's numbers and the wall time."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices_each),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_each}",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if processes > 1:
        env.update(JAXFLOWERS_COORDINATOR=f"127.0.0.1:{_free_port()}",
                   JAXFLOWERS_NUM_PROCESSES=str(processes))
    command = [sys.executable, __file__, "--worker", "--batch", str(args.batch),
               "--epochs", str(args.epochs), "--repeats", str(args.repeats)]
    command += ["--no-sync-batch-norm"] if args.no_sync_batch_norm else []
    t0 = time.perf_counter()
    procs = [subprocess.Popen(command, env=dict(env, JAXFLOWERS_PROCESS_ID=str(i)),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              start_new_session=True) for i in range(processes)]
    try:
        outputs = [p.communicate(timeout=1800)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{processes} x {devices_each}: exit codes "
                           f"{[p.returncode for p in procs]}")
    result = json.loads(outputs[0].strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - t0
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=64, help="global mini-batch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-sync-batch-norm", action="store_true",
                        help="per-device batch statistics (fewer collectives per step)")
    parser.add_argument("--out", default="runs/multihost_cpu.json")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    results = {"1x4": run(1, 4, args), "2x2": run(2, 2, args),
               "machine": platform.processor() or platform.machine(),
               "cpu_count": os.cpu_count()}
    for name in ("1x4", "2x2"):
        r = results[name]
        print(f"{name}: {1e3 * statistics.median(r['step_s']):.1f} ms per step (median of "
              f"{len(r['step_s'])}, {r['iterations']} iterations each), whole run "
              f"{r['wall_s']:.1f} s, loss checksum {r['checksum']:.6f}")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"raw numbers: {out}")


if __name__ == "__main__":
    main()
