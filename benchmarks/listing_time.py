"""How long listing a folder of class folders takes (``ImageFolder``'s scan: every file's
``stat``), by the number of listing threads, repeated over time.

    python benchmarks/listing_time.py FOLDER [--workers 1 2 4 10 16] [--rounds 6] [--every 10]
        [--out FILE.json]

Each round times ``scan`` once per worker count (the order rotating between rounds), and a
plain loop of ``os.scandir`` and ``os.stat`` over the same folders in one thread as the floor;
rounds start ``--every`` seconds apart, so a folder written moments before shows whether its
listing changes as the machine settles. Prints a line per round and a table of medians.
"""
import argparse
import json
import os
import statistics
import time

from jaxflowers.data import scan as scan_lib


def plain(root: str) -> int:
    """Every file of every class folder ``stat``-ed in one thread; how many."""
    count = 0
    for top in sorted(os.scandir(root), key=lambda e: e.name):
        if top.is_dir():
            with os.scandir(top.path) as entries:
                for entry in entries:
                    os.stat(entry.path)
                    count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 10, 16])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    source = scan_lib.LocalFolder(args.folder)
    print(f"{args.folder}: {plain(args.folder)} files; {os.cpu_count()} CPUs; default listing "
          f"threads {scan_lib.decode.default_workers()}", flush=True)
    rows, start = [], time.monotonic()
    for round_ in range(args.rounds):
        time.sleep(max(0.0, start + round_ * args.every - time.monotonic()))
        shift = round_ % len(args.workers)
        order = args.workers[shift:] + args.workers[:shift]
        row = {"round": round_, "at_s": round(time.monotonic() - start, 1)}
        t0 = time.perf_counter()
        plain(args.folder)
        row["plain"] = time.perf_counter() - t0
        for workers in order:
            t0 = time.perf_counter()
            found = scan_lib.scan(source, False, "raise", workers)
            row[str(workers)] = time.perf_counter() - t0
        row["files"] = len(found.files)
        rows.append(row)
        print(f"round {round_} at {row['at_s']:.0f} s: plain {row['plain']:.3f} s; " + ", ".join(
            f"{w} threads {row[str(w)]:.3f} s" for w in args.workers), flush=True)
    print("\n| listing | median s | min s | max s |\n|---|---|---|---|")
    for key in ["plain", *map(str, args.workers)]:
        values = [r[key] for r in rows]
        name = "plain (one thread, stat only)" if key == "plain" else f"scan, {key} threads"
        print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} | "
              f"{max(values):.3f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"folder": args.folder, "cpus": os.cpu_count(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
