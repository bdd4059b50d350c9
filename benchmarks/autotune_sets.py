"""Cold starts with and without a set of XLA's autotuning results, on the GPU.

    python benchmarks/autotune_sets.py --sets DIR [--sweep CIFAR] [--example FLOWERS]
        [--rounds 1] [--example-epochs 10] [--jobs-per-device 4] [--mps on] [--out FILE.json]

First one cold run of each workload without sets (``JAXFLOWERS_AUTOTUNE_RESULTS=off``) fills
its scratch's autotune folder; the folders are merged and packed into a set in DIR by the
package's own command (``python -m jaxflowers.compilation.autotune pack``). Then each round
runs every workload cold with the set (``JAXFLOWERS_AUTOTUNE_RESULTS=DIR``) and without, the
order alternating between rounds. A run is ``end_to_end.py KIND DATA --runs cold`` on a fresh
scratch: every cache empty but what the set puts in. Prints each run as it ends, then a
table; ``--out`` holds the runs so far after each one. A set in DIR that matches this
installation (``python -m jaxflowers.compilation.autotune list``) skips the generating runs;
sets of other GPUs or versions stay as they are, and this installation's is packed beside
them (so DIR may be ``jaxflowers/compilation/autotune_results``). A generating run that
fails, or a packed set that still does not match, stops it before any timed run, since
"with set" would mean without.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from jaxflowers.compilation.autotune import FOLDER  # inside end_to_end's scratch/xla

HERE = os.path.dirname(os.path.abspath(__file__))


def merge(folders: list[str], dest: str) -> int:
    """Copy every file under each autotune folder into ``dest``, keeping relative paths (the
    first folder holding a path wins); how many were copied."""
    copied = 0
    for folder in folders:
        for root, _, files in os.walk(folder):
            for name in files:
                source = os.path.join(root, name)
                place = os.path.join(dest, os.path.relpath(source, folder))
                if not os.path.exists(place):
                    os.makedirs(os.path.dirname(place), exist_ok=True)
                    shutil.copy2(source, place)
                    copied += 1
    return copied


def cold_run(kind: str, data: str, extra: list[str], scratch: str, sets: str,
             timeout: float) -> dict:
    """One ``end_to_end.py`` cold run with ``JAXFLOWERS_AUTOTUNE_RESULTS=sets``; its row."""
    out = os.path.join(scratch, "row.json")
    cmd = [sys.executable, os.path.join(HERE, "end_to_end.py"), kind, data, "--scratch",
           scratch, "--runs", "cold", "--out", out, "--timeout", str(timeout), *extra]
    proc = subprocess.run(cmd, env=dict(os.environ, JAXFLOWERS_AUTOTUNE_RESULTS=sets),
                          capture_output=True, text=True)
    if proc.returncode or not os.path.exists(out):
        return {"returncode": proc.returncode, "stderr_tail": proc.stderr[-2000:]}
    with open(out) as f:
        row = json.load(f)[0]
    row.pop("lines_at_s", None)
    return row


def failed(row: dict) -> bool:
    """Whether ``row`` is a run that did not finish (no wall time, or a non-zero exit)."""
    return "wall_s" not in row or bool(row.get("returncode"))


def summary(row: dict) -> str:
    """Wall, compile (the sweep: its slowest job's) and accuracy of a row, in one line."""
    if failed(row):
        tail = row.get("stderr_tail") or row.get("stdout_tail") or ""
        return f"FAILED ({row.get('returncode')}): {tail.strip()[-300:]}"
    compiles = [float(c) for c in re.findall(r"compile ([\d.]+) s", " ".join(row["jobs"]))]
    compile_s = max(compiles) if compiles else row.get("compile_s", float("nan"))
    accuracy = (" ".join(re.findall(r"(\d+\.\d+)%", " ".join(row["jobs"]))) if row["jobs"]
                else f"{row.get('test_accuracy', float('nan')):.2f}")
    return f"wall {row['wall_s']:6.1f} s, compile {compile_s:5.1f} s, accuracy {accuracy}"


def matching(sets: str) -> list[str]:
    """The lines of the package's ``list`` for the sets in ``sets`` that match this
    installation: with none, the "with set" runs would be cold runs like the others."""
    listed = subprocess.run([sys.executable, "-m", "jaxflowers.compilation.autotune", "list"],
                            env=dict(os.environ, JAXFLOWERS_AUTOTUNE_RESULTS=sets),
                            capture_output=True, text=True)
    return [line for line in listed.stdout.splitlines() if line.endswith(", matches")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", required=True,
                        help="folder of sets; this installation's is made there if missing")
    parser.add_argument("--sweep", help="a folder with train/ and test/ (the sweep)")
    parser.add_argument("--example", help="a folder of class folders (the Flowers example)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--example-epochs", type=int, default=10)
    parser.add_argument("--jobs-per-device", default="4")
    parser.add_argument("--mps", default="on", choices=("auto", "on", "off"))
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    parser.add_argument("--out", help="JSON file for the runs")
    args = parser.parse_args()
    work = [(name, data, extra) for name, data, extra in (
        ("sweep", args.sweep, ["--jobs-per-device", args.jobs_per_device, "--mps", args.mps]),
        ("example", args.example, ["--epochs", str(args.example_epochs)])) if data]
    if not work:
        parser.error("name --sweep DATA, --example DATA or both")
    sets = os.path.abspath(args.sets)
    os.makedirs(sets, exist_ok=True)
    runs = []

    def record(name: str, mode: str, row: dict) -> None:
        runs.append(dict(workload=name, mode=mode, **row))
        print(f"{name:8s} {mode:12s} {summary(row)}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(runs, f, indent=1)

    with tempfile.TemporaryDirectory() as scratch:
        found = matching(sets)
        if not found:
            for name, data, extra in work:
                row = cold_run(name, data, extra, os.path.join(scratch, f"gen-{name}"), "off",
                               args.timeout)
                record(name, "without set", row)
                if failed(row):
                    sys.exit(f"the {name} run that was to fill the set failed: no set packed")
            merged = os.path.join(scratch, "merged")
            copied = merge([os.path.join(scratch, f"gen-{name}", "xla", FOLDER)
                            for name, _, _ in work], merged)
            print(f"{copied} files in the autotune folders", flush=True)
            packed = subprocess.run([sys.executable, "-m", "jaxflowers.compilation.autotune",
                                     "pack", merged, "--out", sets], capture_output=True,
                                    text=True)
            print(packed.stdout.strip() or packed.stderr.strip()[-2000:], flush=True)
            if packed.returncode:
                sys.exit("packing the set failed")
            found = matching(sets)
        if not found:
            sys.exit(f"no set in {sets} matches this installation (python -m "
                     "jaxflowers.compilation.autotune list): runs with it would be cold runs")
        print("\n".join(found), flush=True)
        for r in range(args.rounds):
            modes = [("with set", sets), ("without set", "off")]
            for mode, setting in modes[::-1] if r % 2 else modes:
                for name, data, extra in work:
                    record(name, mode, cold_run(name, data, extra, os.path.join(
                        scratch, f"{name}-{r}-{setting == 'off'}"), setting, args.timeout))
    print(f"\n{'workload':8s} {'mode':12s}")
    for row in runs:
        print(f"{row['workload']:8s} {row['mode']:12s} {summary(row)}")


if __name__ == "__main__":
    main()
