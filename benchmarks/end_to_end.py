"""Wall time of the two MATLAB examples through the CLI, cold and warm, as a user runs them.

    python benchmarks/end_to_end.py example DATA [--devices N] [--seeds 0 1]  # ResNet-50
    python benchmarks/end_to_end.py sweep DATA [--devices N] [--jobs-per-device K|auto]
        [--mps auto|on|off] [--epochs 30] [--bytecode as-is|cached]

Each run is a fresh ``python -m jaxflowers ...`` process timed from outside. "cold" starts
with empty resize and compilation caches (in ``--scratch``, default a temporary folder);
"warm" runs again with both caches as the cold run left them; each further seed of
``--seeds`` is one more warm run with that seed. DATA: a folder of class folders for "example"
(e.g. ``benchmarks/synthetic_folders.py flowers DEST``), a folder with train/ and test/
for "sweep" (``synthetic_folders.py cifar DEST``). Prints a table, with how long each process
took to exit after its last line; --out saves JSON (with when each line of the command came).
The runs import the package that ``PYTHONPATH`` names first, else the current folder's.
``--bytecode cached`` lets them cache Python's bytecode in the scratch folder (kept across
cold runs, as an install's is) where the environment forbids writing it.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time


def command(args) -> list[str]:
    base = [sys.executable, "-m", "jaxflowers"]
    if args.kind == "example":
        cmd = base + ["train", "--data", args.data, "--model", "resnet50", "--quiet",
                      "--out", os.path.join(args.scratch, "train")]
        if args.epochs:
            cmd += ["--epochs", str(args.epochs)]
    else:
        cmd = base + ["sweep", "--depths", "1", "2", "3", "4", "--data", args.data,
                      "--epochs", str(args.epochs or 30), "--jobs-per-device",
                      str(args.jobs_per_device), "--mps", args.mps,
                      "--out", os.path.join(args.scratch, "sweep")]
    if args.devices:
        cmd += ["--devices", str(args.devices)]
    return cmd


def run_once(cmd, env, timeout: float | None = None) -> dict:
    """One run: wall seconds, and how long the process took to exit after its last line."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    errors = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
    reader.start()
    timer = threading.Timer(timeout or 1e9, proc.kill)
    timer.start()
    lines, times = [], []  # each line, and when it came (seconds since the start)
    for line in proc.stdout:
        lines.append(line)
        times.append(time.perf_counter() - start)
    returncode = proc.wait()
    wall = time.perf_counter() - start
    timer.cancel()
    reader.join()
    result = subprocess.CompletedProcess(cmd, returncode, "".join(lines), "".join(errors))
    if timeout and wall >= timeout:
        return {"wall_s": wall, "returncode": "timeout", "stdout_tail": result.stdout[-2000:]}
    out = result.stdout
    row = {"wall_s": wall, "returncode": result.returncode,
           "exit_after_last_line_s": round(wall - (times[-1] if times else 0.0), 3),
           # when each line came, for the parts outside the command's own "Seconds:" lines
           "lines_at_s": [f"{t:7.2f} {line.rstrip()[:90]}" for t, line in zip(times, lines)]}
    if m := re.search(r"Compile ([\d.]+) s, training ([\d.]+) s \(([\d,]+) images/s", out):
        row.update(compile_s=float(m[1]), train_s=float(m[2]),
                   images_per_s=float(m[3].replace(",", "")))
    # The train command's parts, and within its set-up the compile and the placing.
    for m in re.finditer(r"^(?:Seconds|Set-up seconds, overlapping): (.*)$", out, re.M):
        row.setdefault("parts_s", {}).update(
            {name.strip(): float(value) for name, value in
             re.findall(r"([a-zA-Z -]+?) ([\d.]+)(?:,|$)", m[1])})
    if m := re.search(r"Wall time: ([\d.]+) s", out):
        row["run_sweep_s"] = float(m[1])
    if m := re.search(r"Prepared the data in ([\d.]+) s", out):
        row["prepare_s"] = float(m[1])
    if m := re.search(r"Test accuracy[^:]*: ([\d.]+)%", out):
        row["test_accuracy"] = float(m[1])
    # A sweep's per-job lines: accuracy, compile, training, first step and end on its clock.
    row["jobs"] = re.findall(r"^  (job \d+ \(depth \d+\): .*)$", out, re.M)
    if result.returncode:
        row["stderr_tail"] = result.stderr[-2000:]
    return row


def start_ups(log_dir: str, what: str = "Start-up") -> list[str]:
    """Each sweep job's "Start-up, seconds after the job reached its worker: ..." line (or its
    "End, ..." line), by job."""
    lines = []
    for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        with open(os.path.join(log_dir, name), errors="replace") as log:
            found = re.findall(rf"^{what}, seconds after the job reached its worker: (.*)$",
                               log.read(), re.M)
        lines += [f"{name}: {what.lower()} {found[-1]}"] if found else []
    return lines


def run_environment(scratch: str, bytecode: str = "as-is", base=None) -> dict:
    """The runs' environment: their caches in ``scratch``, the package of ``PYTHONPATH``
    first, then the current folder's ("python -m" alone would put the current folder first);
    ``bytecode="cached"``: Python's bytecode written and read in ``scratch/pycache``."""
    base = os.environ if base is None else base
    path = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(base, JAXFLOWERS_CACHE_DIR=os.path.join(scratch, "cache"),
               JAXFLOWERS_COMPILE_CACHE=os.path.join(scratch, "xla"), PYTHONSAFEPATH="1",
               PYTHONPATH=os.pathsep.join(path + [os.getcwd()]))
    if bytecode == "cached":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(scratch, "pycache")
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("example", "sweep"))
    parser.add_argument("data")
    parser.add_argument("--devices", type=int)
    parser.add_argument("--jobs-per-device", default="1", help="N or auto (sweep)")
    parser.add_argument("--mps", default="auto", choices=("auto", "on", "off"), help="(sweep)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="(example) the runs use the first; one warm run per further seed")
    parser.add_argument("--runs", nargs="+", default=["cold", "warm"], choices=("cold", "warm"))
    parser.add_argument("--scratch", help="caches and outputs (kept); default: a temporary folder")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument("--out", help="JSON file for the rows")
    parser.add_argument("--bytecode", choices=("as-is", "cached"), default="as-is",
                        help="cached: the runs write and read Python's bytecode in "
                             "SCRATCH/pycache (PYTHONPYCACHEPREFIX, PYTHONDONTWRITEBYTECODE "
                             "removed), as an installed package runs; as-is: the environment's "
                             "choice (where it sets PYTHONDONTWRITEBYTECODE, every process "
                             "compiles the modules that have no .pyc)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        scratch = args.scratch = args.scratch or temporary
        env = run_environment(scratch, args.bytecode)
        cmd = command(args)
        print(" ".join(cmd), flush=True)
        plan = [(run, args.seeds[0]) for run in args.runs]
        plan += [("warm", seed) for seed in args.seeds[1:]] if args.kind == "example" else []
        for run, seed in plan:
            if run == "cold":
                for folder in ("cache", "xla"):
                    shutil.rmtree(os.path.join(scratch, folder), ignore_errors=True)
            row = dict(run=run, kind=args.kind, devices=args.devices, seed=seed, mps=args.mps,
                       jobs_per_device=args.jobs_per_device,
                       **run_once(cmd + ["--seed", str(seed)], env, args.timeout))
            if args.kind == "sweep":  # each job's start-up, from its log
                logs = os.path.join(scratch, "sweep", "sweep-logs")
                row["start_up"], row["end"] = start_ups(logs), start_ups(logs, "End")
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"{'run':6s} {'wall s':>8s} {'compile s':>10s} {'train s':>8s} {'rest s':>7s}")
    for r in rows:
        rest = (r["wall_s"] - r["compile_s"] - r["train_s"]) if "compile_s" in r else None
        name = f"{r['run']}{r['seed']}"
        print(f"{name:6s} {r['wall_s']:8.1f} {r.get('compile_s', float('nan')):10.1f} "
              f"{r.get('train_s', float('nan')):8.1f} "
              f"{rest if rest is not None else float('nan'):7.1f}"
              + (f"  (run_sweep {r['run_sweep_s']:.1f} s)" if "run_sweep_s" in r else "")
              + (f"  (exit {r['exit_after_last_line_s']:.2f} s after the last line)"
                 if "exit_after_last_line_s" in r else "")
              + (f"  FAILED rc={r['returncode']}" if r["returncode"] else ""))
        if "parts_s" in r:
            print("         " + ", ".join(f"{k} {v:.1f}" for k, v in r["parts_s"].items()))
        for line in r.get("jobs", []) + r.get("start_up", []) + r.get("end", []):
            print(f"         {line}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
