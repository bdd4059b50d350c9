"""Sum a ``jax.profiler`` perfetto trace per step: each timeline's busy time and span, and the
GPU kernels by kind and by name. Used by ``step_profile.py`` and ``cifar_channels.py``."""
import collections
import glob
import gzip
import json


def find_trace(folder):
    """The perfetto trace ``jax.profiler.trace(folder, create_perfetto_trace=True)`` wrote."""
    found = glob.glob(f"{folder}/**/perfetto_trace.json.gz", recursive=True)
    return found[0] if found else None


def kind(name):
    """A kernel's kind from its name: nccl, conv/gemm, reduce, transpose/copy or fusion/other."""
    low = name.lower()
    if "nccl" in low:
        return "nccl"
    if any(low.startswith(s) for s in ("sm90", "sm80", "nvjet", "void cutlass", "_zn17cutlass",
                                       "cutlass", "xmma", "void xmma", "cudnn", "void cudnn")):
        return "conv/gemm"
    if "reduc" in low:
        return "reduce"
    if "transpose" in low or "copy" in low:
        return "transpose/copy"
    return "fusion/other"


def load(path):
    """A perfetto trace's events, its process names by pid and thread names by (pid, tid)."""
    with gzip.open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    pname, tname = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pname[e["pid"]] = e["args"]["name"]
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            tname[(e["pid"], e["tid"])] = e["args"]["name"]
    return events, pname, tname


def _busy_and_span(events, steps):
    """Milliseconds per step a timeline's events take, and from its first start to its last end."""
    busy = sum(x["dur"] for x in events) / 1e3 / steps
    span = (max(x["ts"] + x["dur"] for x in events) - min(x["ts"] for x in events)) / 1e3 / steps
    return busy, span


def summarize(path, steps, tag, log=print, top=25):
    """Log per step: the 12 busiest timelines (busy ms, span ms, events), then for up to three
    GPU timelines the kernel time by kind and the ``top`` kernels by name.

    Returns:
      dict: per GPU timeline, {"busy_ms", "span_ms", "kernels", "by_kind", "top"} per step.
    """
    events, pname, tname = load(path)
    lines = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            lines[(e["pid"], e["tid"])].append(e)
    busiest = sorted(lines.items(), key=lambda kv: -sum(x["dur"] for x in kv[1]))
    log(f"--- {tag}: lines (ms per step, events per step)")
    for key, es in busiest[:12]:
        busy, span = _busy_and_span(es, steps)
        log(f"  {pname.get(key[0], key[0])[:40]:40s} | {tname.get(key, key[1])[:30]:30s} "
            f"busy {busy:8.3f} span {span:8.3f} n {len(es) / steps:7.1f}")
    out = {}
    for key, es in busiest:
        name = pname.get(key[0], "") + "|" + tname.get(key, "")
        if "gpu" not in name.lower():
            continue
        if len(out) == 3:
            break
        by_name = collections.defaultdict(lambda: [0.0, 0])
        for x in es:
            by_name[x["name"]][0] += x["dur"]
            by_name[x["name"]][1] += 1
        by_kind = collections.defaultdict(float)
        for nm, (d, _) in by_name.items():
            by_kind[kind(nm)] += d / 1e3 / steps
        ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
        busy, span = _busy_and_span(es, steps)
        out[name] = {"busy_ms": busy, "span_ms": span,
                     "kernels": len(es) / steps, "by_kind": dict(by_kind),
                     "top": [[nm, d / 1e3 / steps, c / steps] for nm, (d, c) in ranked]}
        log(f"  == {name[:70]}: kinds ms/step " + ", ".join(
            f"{k}={v:.3f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
        for nm, d, c in out[name]["top"]:
            log(f"     {d:7.3f} ms x{c:5.1f}  {nm[:110]}")
    return out
