"""The caller's side of tests/test_ray_cluster.py, run inside a private network namespace
next to a ``ray start --head`` cluster: ``python ray_cluster_driver.py ADDRESS``.

Prints one JSON line of facts for the test to check; exits non-zero on a failed check.
"""
import json
import sys
import threading
import time

import sweep_jobs

import jaxflowers.sweep as sweep


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def main(address: str) -> int:
    facts = {}
    with sweep.DevicePool("all", backend="ray", address=address) as pool:
        facts["slots"] = pool.num_slots
        messages, started = [], threading.Event()

        @pool.after_each
        def collect(job_index, message):
            messages.append((job_index, message))
            if "pid" in message:
                started.set()

        facts["sum"] = pool.submit(sweep_jobs.add, 1, 2).result(timeout=120)
        facts["node_module"] = pool.submit(sweep_jobs.node_module).result(timeout=120)
        sleeper = pool.submit(sweep_jobs.announce_and_sleep, 60, with_child=True)
        assert started.wait(120), "the sleeping job never reported"
        pids = next(m for _, m in messages if "pid" in m)
        start = time.monotonic()
        facts["cancelled"] = sleeper.cancel() and sleeper.cancelled()
        facts["job_gone"] = _gone(pids["pid"], 10) and _gone(pids["child"], 10)
        facts["cancel_seconds"] = time.monotonic() - start
        facts["messages"] = sorted({m.get("i", -1) for j, m in messages if j == 0})
    print(json.dumps(facts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
