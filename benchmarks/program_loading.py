"""Where a warm start's training program comes from: the program built (``TrainProgram``),
its training block traced, lowered, then loaded from JAX's persistent compilation cache,
against the same executable serialized and loaded back without tracing.

    python benchmarks/program_loading.py [--models resnet50 cifar_net:4] [--rounds 2]
        [--out FILE.json]

Per model: one process compiles cold into a fresh cache folder, then ``--rounds`` processes
start warm; each calls ``train`` on synthetic data of the bench's shapes (ResNet-50: 224 px,
Adam, the Flowers augmentation; cifar_net: 32 px, SGDM, the sweep's), stops it in
``TrainProgram.prepare`` and times, one after another in one thread: ``TrainProgram(...)``,
``lower_block()`` (tracing and lowering), ``.compile()`` (the cache's load when warm),
``serialize`` and ``deserialize_and_load`` (``jax.experimental.serialize_executable``).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under safe-path
from prepare_probe import child_command

CHILD = r"""
import json, sys, time
from jax.experimental import serialize_executable as se
from jaxflowers.compilation import enable_compilation_cache
from jaxflowers.training import program as program_lib
from prepare_probe import stop_in_prepare

enable_compilation_cache(sys.argv[2])
row = {}
init = program_lib.TrainProgram.__init__


def timed_init(self, *a, **k):
    t0 = time.perf_counter()
    init(self, *a, **k)
    row["program_s"] = time.perf_counter() - t0


def probe(self):
    t0 = time.perf_counter()
    lowered = self.lower_block()
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    blob = se.serialize(compiled)
    t3 = time.perf_counter()
    se.deserialize_and_load(*blob)
    t4 = time.perf_counter()
    row.update(lower_s=t1 - t0, compile_s=t2 - t1, serialize_s=t3 - t2, load_serialized_s=t4 - t3,
               serialized_mb=len(blob[0]) / 1e6)


program_lib.TrainProgram.__init__ = timed_init
t0 = time.perf_counter()
stop_in_prepare(sys.argv[1], probe, num_images=2560 if sys.argv[1] == "resnet50" else 45000)
row["train_call_s"] = time.perf_counter() - t0
print("ROW " + json.dumps(row), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "cifar_net:4"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = []
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    for model in args.models:
        with tempfile.TemporaryDirectory() as cache:
            for run in ["cold"] + ["warm"] * args.rounds:
                t0 = time.perf_counter()
                out = subprocess.run(child_command(CHILD) + [model, cache], env=env,
                                     capture_output=True, text=True)
                wall = time.perf_counter() - t0
                found = [line for line in out.stdout.splitlines() if line.startswith("ROW ")]
                if not found:
                    print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
                    raise SystemExit(f"{model} {run}: no result (rc {out.returncode})")
                rows.append({"model": model, "run": run, "process_s": wall,
                             **json.loads(found[-1][4:])})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{'model':>12} {'run':>5} {'program':>8} {'lower':>7} {'compile':>8} {'ser.':>6} "
          f"{'load ser.':>9} {'MB':>6}")
    for r in rows:
        print(f"{r['model']:>12} {r['run']:>5} {r['program_s']:8.2f} {r['lower_s']:7.2f} "
              f"{r['compile_s']:8.2f} {r['serialize_s']:6.2f} {r['load_serialized_s']:9.2f} "
              f"{r['serialized_mb']:6.1f}")


if __name__ == "__main__":
    main()
