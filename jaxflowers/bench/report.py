"""The bench's report: ``bench.json``, the table, the figure; no JAX, so it redraws anywhere."""
from __future__ import annotations

import json
import pathlib
import statistics

from jaxflowers.host.files import write_json_atomic
from jaxflowers.plots import speedup, speedup_table

__all__ = ["draw", "fold_peer", "peer_ratios", "save", "table_lines"]


def save(report: dict, path) -> pathlib.Path:
    """Write ``report`` as JSON, atomically."""
    return write_json_atomic(path, report)


def draw(json_path, png_path) -> pathlib.Path:
    """``speedup.png`` from the JSON file as written (not from in-memory numbers)."""
    import matplotlib.pyplot as plt

    plt.close(speedup(json.loads(pathlib.Path(json_path).read_text()), path=png_path))
    return pathlib.Path(png_path)


def table_lines(report: dict) -> list[str]:
    """The speedup table (``plots.speedup_table``) with batch, step time and compile time."""
    rows = speedup_table(report["results"]) if report["results"] else []
    head = (f"{'model':<12} {'strategy':<14} {'scaling':<7} {'devices':>7} {'batch':>6} "
            f"{'images/s':>10} {'step ms':>9} {'speedup':>8} {'effic.':>7} {'compile s':>9}")
    lines = [head, "-" * len(head)]
    for row in rows:
        same = [r for r in report["results"] if all(
            r[k] == row[k] for k in ("model", "strategy", "scaling", "devices"))]
        lines.append(
            f"{row['model']:<12} {row['strategy']:<14} {row['scaling']:<7} {row['devices']:>7} "
            f"{same[0]['global_batch']:>6} {row['images_per_s']:>10.1f} "
            f"{1e3 * statistics.median(r['step_s'] for r in same):>9.2f} "
            f"{row['speedup']:>8.2f} {100 * row['efficiency']:>6.1f}% "
            f"{statistics.median(r['compile_s'] for r in same):>9.1f}")
    return lines


def _solver(record: dict) -> str | None:
    """The record's solver in jaxflowers' names (torch's "sgd" is momentum SGD: "sgdm")."""
    solver = record.get("solver")
    return "sgdm" if solver == "sgd" else solver


def peer_ratios(report: dict) -> list[dict]:
    """jaxflowers over torch images/s per matching configuration (torch peers that augment)."""
    ours = [r for r in report["results"] if r.get("framework") == "jaxflowers"]
    ratios = []
    for peer in (r for r in report["results"] if r.get("framework") == "torch"
                 and r.get("data", "augment") == "augment"):
        for r in ours:
            same_solver = None in (_solver(r), _solver(peer)) or _solver(r) == _solver(peer)
            if same_solver and all(r[k] == peer[k] for k in (
                    "model", "scaling", "devices", "per_device_batch", "image_size")):
                ratios.append({"model": r["model"], "devices": r["devices"],
                               "jaxflowers": r["strategy"], "torch": peer["strategy"],
                               "ratio": r["images_per_s"] / peer["images_per_s"]})
    return ratios


def fold_peer(report: dict, peer: dict) -> None:
    """Add the peer's records to ``report`` (results, speedup) and the ratios."""
    report["peer"] = {k: v for k, v in peer.items() if k != "results"}
    report["results"] = report["results"] + list(peer.get("results", []))
    report["speedup"] = speedup_table(report["results"]) if report["results"] else []
    report["peer_ratios"] = peer_ratios(report)
