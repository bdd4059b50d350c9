"""Each GPU kernel of a profiled step against the bytes its HLO instruction moves: the memory
rate it reached, so the kernels far below the memory's rate stand out.

    XLA_FLAGS="--xla_dump_to=DUMP --xla_dump_hlo_as_text" SAVE_TRACE=ours_adam_aug1 OUT=OUT \\
        python benchmarks/step_profile.py ours_adam_aug1
    python benchmarks/fusion_bandwidth.py DUMP/*jit_train_block*after_optimizations.txt \\
        OUT/trace_ours_adam_aug1.json.gz [--steps 5] [--top 60]

A kernel's bytes are its instruction's operands and results as whole arrays (a fusion that
reads only a slice of an operand is overstated). Kernels XLA deduplicated (one kernel for
several instructions of the same body) are named after one of them, whose bytes stand for
each call. Convolution and GEMM libraries' kernels carry no instruction name and are summed
apart.
"""
import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_summary  # noqa: E402

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([0-9,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+)")
_DEFINES = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (\(.*?\)|\S+) ")
_CALL = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (\(.*?\)|\S+) (?:fusion|custom-call)"
                   r"\((.*?)\), (.*)")


def array_bytes(text: str) -> int:
    """Bytes of every array shape written in ``text`` (a shape or a tuple of shapes)."""
    total = 0
    for dtype, dims in _ARRAY.findall(text):
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        total += count * _BYTES[dtype]
    return total


def instruction_bytes(hlo: str) -> dict:
    """Per fusion or custom call of an optimized HLO module: operand bytes, result bytes and
    its ``op_name``."""
    shapes, found, computation = {}, {}, None
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            computation = _HEADER.match(line).group(1)
            continue
        if not (defined := _DEFINES.match(line)) or computation is None:
            continue
        shapes[(computation, defined.group(1))] = defined.group(2)
        m = _CALL.match(line)  # operands are defined above their users
        if not m:
            continue
        name, result, operands, rest = m.groups()
        read = 0
        for operand in re.findall(r"%([\w.\-]+(?:#\d+)?)", operands):
            base, _, index = operand.partition("#")
            shape = shapes.get((computation, base), "")
            if index:  # one element of a tuple-shaped operand
                parts = _ARRAY.finditer(shape)
                shape = next((p.group(0) for i, p in enumerate(parts) if i == int(index)), "")
            read += array_bytes(shape)
        op = re.search(r'op_name="([^"]+)"', rest)
        found[name] = {"read": read, "written": array_bytes(result),
                       "op_name": op.group(1) if op else ""}
    return found


def kernel_times(trace_path: str, steps: int) -> dict:
    """Per GPU kernel name of a perfetto trace: milliseconds per step and calls per step."""
    events, processes, _ = trace_summary.load(trace_path)
    gpu = {pid for pid, name in processes.items() if "gpu" in name.lower()}
    times = collections.defaultdict(lambda: [0.0, 0.0])
    for e in events:
        if e.get("ph") == "X" and e.get("pid") in gpu and "dur" in e:
            times[e["name"]][0] += e["dur"] / 1e3 / steps
            times[e["name"]][1] += 1 / steps
    return times


def table(hlo: str, trace_path: str, steps: int) -> list[dict]:
    """One row per kernel, slowest first: ms per step, calls, bytes per call, TB/s reached."""
    instructions = instruction_bytes(hlo)
    rows = []
    for kernel, (ms, calls) in kernel_times(trace_path, steps).items():
        # the trace writes an instruction's ".N" suffix as "_N"
        info = instructions.get(kernel) or instructions.get(re.sub(r"_(\d+)$", r".\1", kernel))
        moved = info["read"] + info["written"] if info else 0
        rows.append({"kernel": kernel, "ms": ms, "calls": calls, "bytes": moved,
                     "tb_per_s": moved / 1e9 / (ms / calls) if moved and ms else None,
                     "op_name": info["op_name"] if info else ""})
    return sorted(rows, key=lambda r: -r["ms"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hlo", help="the module's *after_optimizations.txt")
    parser.add_argument("trace", help="perfetto trace (.json.gz) of the module's runs")
    parser.add_argument("--steps", type=int, default=5, help="steps the trace holds")
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--out", help="JSON file for every row")
    args = parser.parse_args(argv)
    with open(args.hlo) as f:
        rows = table(f.read(), args.trace, args.steps)
    named = [r for r in rows if r["bytes"]]
    total, matched = sum(r["ms"] for r in rows), sum(r["ms"] for r in named)
    moved = sum(r["bytes"] * r["calls"] for r in named) / 1e9
    print(f"GPU kernels {total:.3f} ms a step; with an HLO instruction {matched:.3f} ms, "
          f"{moved:.2f} GB, {moved / matched if matched else 0:.2f} TB/s overall")
    for r in rows[:args.top]:
        rate = f"{r['tb_per_s']:5.2f} TB/s" if r["tb_per_s"] else "          "
        print(f"{r['ms']:7.3f} ms x{r['calls']:5.1f}  {r['bytes'] / 1e6:7.0f} MB  {rate}  "
              f"{r['kernel'][:40]:40s} {r['op_name'][-60:]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
