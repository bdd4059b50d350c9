"""Launches per training iteration of the program a GPU runs, compiled for a named NVIDIA GPU on
a machine without one (XLA's compile-only CUDA devices), for package trees side by side.

    pip install "jax[cuda12]"   # the CUDA plugin: no GPU or driver is needed to compile
    python benchmarks/gpu_kernels.py --tree old=OLD --tree new=. [--models cifar_net:1 ...]
        [--gpu h200] [--schedule piecewise] [--list] [--hlo DIR] [--out FILE.json]

Each tree's ``train`` is stopped in ``TrainProgram.prepare`` (as ``trace_time.py`` does) with
the choices it makes on a GPU (bfloat16, one parameter vector, its iterations per dispatch,
padded channels, its Pallas kernels); its training block is compiled for the GPU and the
optimized HLO's launches are counted: every fusion, cuDNN or cuBLAS call, Pallas kernel, copy
and collective in the loop's body (one iteration) and outside it (once a dispatch). These are
what XLA emits, not what the GPU runs: a cuDNN call may launch several kernels (a split-K
reduction), and convolution and GEMM algorithms are picked without autotuning here. A profile
on the GPU (``cifar_channels.py --profile-epochs``) counts the kernels themselves. The
compile's seconds are XLA's GPU pipeline on this machine's CPU without autotuning: a cold
compile's floor if autotuning were free.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under safe-path
import package_trees
from prepare_probe import HERE, child_command

# XLA's GpuTargetConfigProto, text format: what the compiler asks of the device (Hopper's
# limits; the memory and bandwidth of NVIDIA's data sheets).
_TARGET = """gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: {cores}
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: {bandwidth} l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: {memory} shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 minor: 0 }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 patch: 0 }}
device_description_str: "{name}"
"""
GPUS = {
    "h200": dict(name="NVIDIA H200", cores=132, bandwidth=4_800_000_000_000,
                 memory=141_000_000_000),
    "h100": dict(name="NVIDIA H100 80GB HBM3", cores=132, bandwidth=3_350_000_000_000,
                 memory=80_000_000_000),
}

CHILD = r"""
import sys
import time
import jax
import jax.numpy as jnp
from jax.experimental import topologies

import jaxflowers as jf
from jaxflowers.bench import scaling
from jaxflowers.parallel.data_parallel import DataParallel
from prepare_probe import stop_in_prepare

model, target, out, schedule = sys.argv[1:5]
devices = topologies.get_topology_desc(platform="cuda", target_config=target,
                                       topology="1x1x1").devices


def probe(program):
    gpu = DataParallel(devices)  # compile-only devices: nothing runs
    program.parallel = gpu
    program.state_shapes = gpu.abstract(program._local_shapes)
    channels = jax.ShapeDtypeStruct((program.feed.shape[-1],), jnp.float32)
    program.stats_shape = gpu.abstract((channels, channels))
    backend = jax.default_backend
    jax.default_backend = lambda: "gpu"  # traced as on the GPU: its Pallas kernels included
    try:
        lowered = program.lower_block()
    finally:
        jax.default_backend = backend
    start = time.perf_counter()
    text = lowered.compile().as_text()
    print(f"COMPILE_S {time.perf_counter() - start:.3f}", flush=True)
    with open(out, "w") as f:
        f.write(text)


spec = scaling.parse_model(model)
network = spec.build()
if getattr(network, "channel_multiple", 0) is None:  # cifar_net: padded when training on GPUs
    network = network.clone(channel_multiple=8)
size = (spec.image_size, spec.image_size, 3)
chosen = jf.ExecutionOptions().resolve("gpu", size, streamed=False)
execution = jf.ExecutionOptions(precision=chosen.precision,
                                steps_per_dispatch=chosen.steps_per_dispatch,
                                parameter_layout="flat" if chosen.flat_parameters else "tree")
stop_in_prepare(model, probe, execution=execution, network=network,
                options={"learn_rate_schedule": schedule})
"""

_SKIP = {"parameter", "get-tuple-element", "bitcast", "tuple", "constant", "after-all",
         "partition-id", "replica-id", "add-dependency", "opt-barrier"}
_INSTRUCTION = re.compile(r"\s+(?:ROOT )?%(\S+) = .*? ([a-z][\w\-]*)\(")


def computations(hlo: str) -> tuple[dict, str]:
    """``({name: [instruction lines]}, entry name)`` of an HLO module's text."""
    bodies, entry, current = {}, None, None
    for line in hlo.splitlines():
        header = re.match(r"(ENTRY )?%(\S+) \(", line)
        if header:
            current = header.group(2)
            bodies[current] = []
            entry = current if header.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif current is not None and line.startswith("  "):
            bodies[current].append(line)
    if entry is None:
        raise ValueError("no ENTRY computation in this HLO text")
    return bodies, entry


def launches(bodies: dict, name: str, loop: bool = False) -> list[dict]:
    """Every launch of computation ``name``: ``{"name", "kind", "op", "loop"}``. A while
    loop's condition and body count as one iteration's; a conditional's largest branch counts
    (an iteration that trains)."""
    found = []
    for line in bodies[name]:
        match = _INSTRUCTION.match(line)
        if not match or match.group(2) in _SKIP:
            continue
        opcode, head = match.group(2), line.split(", metadata=")[0]
        if opcode == "while":
            for part in ("condition", "body"):
                called = re.search(part + r"=%([\w.\-]+)", head).group(1)
                found += launches(bodies, called, loop=True)
            continue
        if opcode in ("conditional", "call"):
            called = re.findall(r"%([\w.\-]+)", head.split(opcode + "(", 1)[1].split(")", 1)[1])
            branches = [launches(bodies, c, loop) for c in called if c in bodies]
            found += max(branches, key=len, default=[])
            continue
        found.append({"name": match.group(1), "kind": _kind(opcode, head), "loop": loop,
                      "op": (re.search(r'op_name="([^"]*)"', line) or [None, ""])[1]})
    return found


def _kind(opcode: str, head: str) -> str:
    target = re.search(r'custom_call_target="([^"]*)"', head)
    if target and "cudnn" in target.group(1).lower():
        return "cudnn"
    if target and "triton" in target.group(1):
        return "pallas"
    fusion = re.search(r"kind=(\w+)", head)
    if target or (fusion and fusion.group(1) == "kCustom" and "gemm" in head):
        return "gemm/custom"
    if fusion:
        return {"kLoop": "fusion (loop)", "kInput": "fusion (reduce/transpose)"}.get(
            fusion.group(1), "fusion (other)")
    return opcode


def count(hlo: str) -> dict:
    """Launches per iteration (the loop's, or the whole program's without a loop) and per
    dispatch (outside the loop), by kind and by place (forward, backward, other)."""
    bodies, entry = computations(hlo)
    every = launches(bodies, entry)
    in_loop = [x for x in every if x["loop"]] or every

    def place(op):
        return "backward" if "transpose(jvp(" in op else "forward" if "jvp(" in op else "other"

    return {"per_iteration": len(in_loop),
            "per_dispatch": len([x for x in every if not x["loop"]]),
            "by_kind": dict(collections.Counter(x["kind"] for x in in_loop).most_common()),
            "by_place": dict(collections.Counter(place(x["op"]) for x in in_loop)),
            "launches": in_loop}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    package_trees.add_argument(parser)
    parser.add_argument("--models", nargs="+",
                        default=["cifar_net:1", "cifar_net:2", "cifar_net:3", "cifar_net:4"])
    parser.add_argument("--gpu", choices=sorted(GPUS), default="h200")
    parser.add_argument("--schedule", default="none",
                        help="the learning-rate schedule (the Flowers example's: piecewise)")
    parser.add_argument("--list", action="store_true", help="print every launch of an iteration")
    parser.add_argument("--hlo", help="keep each compiled module's text in this folder")
    parser.add_argument("--out")
    args = parser.parse_args()
    trees = package_trees.parse(parser, args.tree)
    target = _TARGET.format(**GPUS[args.gpu])
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        if args.hlo:
            os.makedirs(args.hlo, exist_ok=True)
            scratch = args.hlo
        for label, path in trees:
            env = package_trees.environment(path, dict(os.environ, JAX_PLATFORMS="cpu"))
            for model in args.models:
                hlo = os.path.join(scratch, f"{label}-{model}.hlo")
                done = subprocess.run(child_command(CHILD) + [model, target, hlo, args.schedule],
                                      env=env, capture_output=True, text=True, cwd=HERE)
                if done.returncode or not os.path.exists(hlo):
                    raise SystemExit(f"{label} {model}: not compiled\n{done.stderr[-3000:]}")
                with open(hlo) as f:
                    counted = count(f.read())
                seconds = [float(line.split()[1]) for line in done.stdout.splitlines()
                           if line.startswith("COMPILE_S ")]
                if args.list:
                    for x in counted["launches"]:
                        print(f"  {label} {model} {x['kind']:26} {x['name']:40} {x['op'][-90:]}")
                rows.append({"tree": label, "model": model, "gpu": GPUS[args.gpu]["name"],
                             "compile_s": seconds[-1] if seconds else None,
                             **{k: v for k, v in counted.items() if k != "launches"}})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\n{'model':>12} {'tree':>8} {'per iteration':>14} {'per dispatch':>13} "
          f"{'compile s':>10}  by kind")
    for row in rows:
        kinds = ", ".join(f"{k} {v}" for k, v in row["by_kind"].items())
        print(f"{row['model']:>12} {row['tree']:>8} {row['per_iteration']:>14} "
              f"{row['per_dispatch']:>13} {row['compile_s'] or 0:>10.1f}  {kinds}")


if __name__ == "__main__":
    main()
