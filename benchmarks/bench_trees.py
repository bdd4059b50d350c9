"""The bench (``python -m jaxflowers.bench``) for package trees side by side on one machine,
alternating: how "one call, alternating" figures in ``benchmarks/NOTES.md`` are taken.

    python benchmarks/bench_trees.py --tree old=OLD --tree new=NEW [--batches 128 256]
        [--rounds 2] [--budget SECONDS] [--out FILE.json] [--bench-args "..."]

Each tree is a folder holding a ``jaxflowers`` package (``git archive REV jaxflowers | tar -x
-C OLD``). A round runs every (batch, tree) once, the trees in reverse order on odd rounds, so
neither always runs first on a warming machine. Each run is a fresh process in an empty
folder, with its tree first on ``PYTHONPATH`` and ``PYTHONSAFEPATH`` set, so no other copy of
the package is imported. Prints each run as it ends and a table at the end; ``--out`` holds the
rows after each run. ``--budget`` skips runs that would start after that many seconds (a
machine lent for a fixed time).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under safe-path
import package_trees

BENCH = "--models resnet50 --devices 1 --strategies shard_map --scalings weak"


def plan(trees: list[str], batches: list[int], rounds: int) -> list[tuple[int, int, str]]:
    """``(round, batch, tree)`` in the order they run."""
    return [(r, batch, tree) for r in range(rounds) for batch in batches
            for tree in package_trees.in_round(trees, r)]


def run_one(path: str, batch: int, bench_args: str, timeout: float) -> dict:
    """One bench process for the tree at ``path``: its result row, or why it failed."""
    with tempfile.TemporaryDirectory() as work:
        env = package_trees.environment(path)
        cmd = [sys.executable, "-m", "jaxflowers.bench", *shlex.split(bench_args),
               "--per-device-batch", str(batch), "--out", os.path.join(work, "bench")]
        try:
            done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"no result in {timeout:.0f} s"}
        if done.returncode:
            return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
        with open(os.path.join(work, "bench", "bench.json")) as f:
            report = json.load(f)
    result = report["results"][0]
    return {"images_per_s": round(result["images_per_s"], 1),
            "step_ms": round(batch * 1e3 / result["images_per_s"], 2),
            "compile_s": round(result["compile_s"], 1),
            "device": report["environment"].get("devices")}


def table(rows: list[dict]) -> str:
    lines = [f"{'tree':>10s} {'batch':>6s} {'round':>6s} {'images/s':>10s} {'step ms':>8s} "
             f"{'compile s':>10s}"]
    for row in sorted(rows, key=lambda r: (r["batch"], r["tree"], r["round"])):
        if "error" in row:
            lines.append(f"{row['tree']:>10s} {row['batch']:6d} {row['round']:6d}  "
                         f"{row['error'][:60]}")
        else:
            lines.append(f"{row['tree']:>10s} {row['batch']:6d} {row['round']:6d} "
                         f"{row['images_per_s']:10.1f} {row['step_ms']:8.2f} "
                         f"{row['compile_s']:10.1f}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    package_trees.add_argument(parser)
    parser.add_argument("--batches", type=int, nargs="+", default=[128])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget", type=float, help="seconds after which no run starts")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    parser.add_argument("--bench-args", default=BENCH, help=f"default: {BENCH!r}")
    parser.add_argument("--out", help="JSON file for the rows")
    args = parser.parse_args(argv)
    trees = dict(package_trees.parse(parser, args.tree))
    start, rows = time.perf_counter(), []
    for round_, batch, label in plan(list(trees), args.batches, args.rounds):
        if args.budget is not None and time.perf_counter() - start > args.budget:
            row = {"error": "skipped: past --budget"}
        else:
            row = run_one(trees[label], batch, args.bench_args, args.timeout)
        rows.append({"tree": label, "batch": batch, "round": round_, **row})
        print(json.dumps(rows[-1]), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
