"""What each compiled program of a command costs, for two or more package trees side by side.

    python benchmarks/compile_log.py --tree old=DIR --tree new=. [--rounds 2] [--out FILE] \
        -- python -m jaxflowers train --data DATA --model resnet50 --epochs 1 --quiet

Runs the command once per tree per round, alternating (old, new, then new, old, ...), each
in a fresh process with that tree first on ``PYTHONPATH``, the compilation cache off and
``JAX_LOG_COMPILES=1``. Prints per run the wall time, the CLI's "Compile" figure and the
seconds JAX's log gives each program (lowering, XLA compilation), then a table of
the programs' compile seconds per tree. The command's ``{out}`` is replaced by a fresh folder.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under safe-path
import package_trees

PHASES = {"Finished jaxpr to MLIR module conversion": "lower",
          "Finished XLA compilation of": "compile"}
LINE = re.compile(f"({'|'.join(map(re.escape, PHASES))}) (.+?) in ([\\d.e-]+) sec")


def parse(log: str) -> dict:
    """{phase: {program: summed seconds}} from a JAX_LOG_COMPILES log."""
    out = {phase: collections.Counter() for phase in PHASES.values()}
    for head, name, seconds in LINE.findall(log):
        out[PHASES[head]][name] += float(seconds)
    return {phase: dict(counts) for phase, counts in out.items()}


def run(tree: str, cmd: list[str], scratch: str) -> dict:
    env = package_trees.environment(tree, dict(os.environ, JAX_LOG_COMPILES="1",
                                               JAXFLOWERS_COMPILE_CACHE="off"))
    out = tempfile.mkdtemp(dir=scratch)
    start = time.perf_counter()
    result = subprocess.run([arg.replace("{out}", out) for arg in cmd], env=env,
                            capture_output=True, text=True)
    row = {"wall_s": round(time.perf_counter() - start, 2), "returncode": result.returncode,
           **parse(result.stderr)}
    if m := re.search(r"Compile ([\d.]+) s", result.stdout):
        row["cli_compile_s"] = float(m[1])
    if m := re.search(r"^Seconds: (.*)$", result.stdout, re.M):
        row["cli_seconds"] = m[1]
    if "cli_compile_s" not in row:
        row["stdout_tail"] = result.stdout[-1500:]
    if result.returncode:
        row["stderr_tail"] = result.stderr[-3000:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    package_trees.add_argument(parser)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", help="JSON file for the rows")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    trees = package_trees.parse(parser, args.tree)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(args.rounds):
            for name, tree in package_trees.in_round(trees, r):
                row = {"tree": name, "round": r, **run(tree, cmd, scratch)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    programs = sorted({p for row in rows for p in row["compile"]},
                      key=lambda p: -max(row["compile"].get(p, 0) for row in rows))
    print(f"{'program (XLA compile s)':40s} " + " ".join(f"{n:>14s}" for n, _ in trees))
    for program in programs[:12] + ["(all)", "(CLI Compile)", "(wall)"]:
        cells = []
        for name, _ in trees:
            values = [(sum(row["compile"].values()) if program == "(all)" else
                       row.get("cli_compile_s", float("nan")) if program == "(CLI Compile)" else
                       row["wall_s"] if program == "(wall)" else
                       row["compile"].get(program, 0.0)) for row in rows if row["tree"] == name]
            cells.append("/".join(f"{v:.2f}" for v in values))
        print(f"{program[:40]:40s} " + " ".join(f"{c:>14s}" for c in cells))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
