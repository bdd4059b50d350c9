"""The training block's trace and lowering (Python's share of a warm start) in fresh
processes, for package trees alternating.

    python benchmarks/trace_time.py --tree old=OLD --tree new=. [--models resnet50 cifar_net:4]
        [--rounds 6] [--layout flat] [--precision bfloat16] [--steps-per-dispatch 16]
        [--schedule piecewise] [--out FILE.json]

Each process builds ``train``'s program for the bench's model and shapes (synthetic data),
stops in ``TrainProgram.prepare`` and times ``lower_block()`` four times: the first is what a
run pays (one trace per program per process), the later ones reuse JAX's caches of the small
jitted functions ``jnp`` operators call. ``--layout flat --precision bfloat16`` traces on a
CPU the program GPUs run (one parameter vector, bfloat16); ``--steps-per-dispatch 16`` the
loop of iterations GPUs run for 32x32 images; ``--schedule piecewise`` the Flowers example's
learning-rate schedule.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under safe-path
import package_trees
from prepare_probe import HERE, child_command

CHILD = r"""
import json, sys, time
import jaxflowers as jf
from prepare_probe import stop_in_prepare

times = []


def probe(program):
    for _ in range(4):
        t0 = time.perf_counter()
        program.lower_block()
        times.append(time.perf_counter() - t0)


block = int(sys.argv[4]) if sys.argv[4] != "auto" else None
stop_in_prepare(sys.argv[1], probe, execution=jf.ExecutionOptions(
    parameter_layout=sys.argv[2], precision=sys.argv[3], steps_per_dispatch=block),
    options={"learn_rate_schedule": sys.argv[5]})
print("TIMES " + json.dumps(times), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    package_trees.add_argument(parser)
    parser.add_argument("--models", nargs="+", default=["resnet50", "cifar_net:4"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--layout", default="auto")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--steps-per-dispatch", default="auto")
    parser.add_argument("--schedule", default="none", help="the learning-rate schedule")
    parser.add_argument("--out")
    args = parser.parse_args()
    trees = package_trees.parse(parser, args.tree)
    rows = []
    for round_ in range(args.rounds):
        for label, path in trees:
            env = package_trees.environment(path)
            for model in args.models:
                out = subprocess.run(child_command(CHILD) + [model, args.layout, args.precision,
                                                         args.steps_per_dispatch,
                                                         args.schedule],
                                     env=env, capture_output=True, text=True, cwd=HERE)
                found = [line for line in out.stdout.splitlines() if line.startswith("TIMES ")]
                if not found:
                    raise SystemExit(f"{label} {model}: no result\n{out.stderr[-3000:]}")
                times = json.loads(found[-1][6:])
                rows.append({"round": round_, "tree": label, "model": model, "seconds": times})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    for model in args.models:
        for label, _ in trees:
            runs = [r["seconds"] for r in rows if r["tree"] == label and r["model"] == model]
            first = [s[0] for s in runs]
            later = [x for s in runs for x in s[1:]]
            print(f"{model:>12} {label:>6}  first trace + lower: median "
                  f"{statistics.median(first):.3f} s ({' '.join(f'{x:.2f}' for x in first)}); "
                  f"later: median {statistics.median(later):.3f} s")


if __name__ == "__main__":
    main()
