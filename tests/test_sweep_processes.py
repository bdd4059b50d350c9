"""jaxflowers.sweep's worker processes: none outlives its caller (signals, SIGKILL, a normal
exit, workers still importing), a killed worker fails only its job, warm workers take the next
jobs, and the caller never imports JAX.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
from typing import Sequence

import psutil
import pytest
import sweep_jobs
from worker_processes import alive, gone_within, sweep_workers_soon

import jaxflowers as jf

pytestmark = pytest.mark.timeout(150)
TESTS = pathlib.Path(__file__).resolve().parent
REPO = TESTS.parent


_CALLER = """
import json, sys, time
import jaxflowers.sweep as sweep
import sweep_jobs
import threading
pool = sweep.DevicePool(1)
started = threading.Event()
pool.after_each(lambda i, m: (print(json.dumps(m), flush=True), started.set()))
future = pool.submit(sweep_jobs.announce_and_sleep, 120, with_child=True)
started.wait(60)
if "{scenario}" != "exit":  # "exit" ends the script at once, without shutdown
    time.sleep(120)
"""


def _start_caller(code: str, tmp_path: pathlib.Path,
                  path: Sequence[str] = ()) -> subprocess.Popen:
    # TMPDIR: a caller killed by SIGKILL cannot remove its pool's scratch folder.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, str(REPO), str(TESTS)]),
               TMPDIR=str(tmp_path))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_no_worker_outlives_its_caller(tmp_path):
    """SIGKILL (the worker notices stdin EOF), SIGINT, SIGTERM and a normal exit."""
    scenarios = ("sigkill", "sigint", "sigterm", "exit")
    callers = {s: _start_caller(_CALLER.format(scenario=s), tmp_path) for s in scenarios}
    try:
        pids = {s: json.loads(c.stdout.readline() or "{}") for s, c in callers.items()}
        assert all(p.keys() == {"pid", "child"} for p in pids.values()), (
            pids, {s: c.stderr.read() for s, c in callers.items() if not pids[s]})
        for scenario, signum in [("sigkill", signal.SIGKILL), ("sigint", signal.SIGINT),
                                 ("sigterm", signal.SIGTERM)]:
            callers[scenario].send_signal(signum)
        for scenario, caller in callers.items():
            caller.wait(timeout=20)
            assert gone_within(pids[scenario].values(), 5.0), f"worker outlived {scenario}"
    finally:
        for caller in callers.values():
            caller.kill()
            caller.wait()
            caller.stdout.close()
            caller.stderr.close()


# Makes ``import jax`` hang for a minute in every process started with it on the path (the
# GIL released), so a warm worker is surely still importing when its caller dies.
_SLOW_JAX_IMPORT = """
import sys, time

class _SlowJax:
    def find_spec(self, name, path=None, target=None):
        if name == "jax":
            time.sleep(60)
        return None

sys.meta_path.insert(0, _SlowJax())
"""


def test_warm_workers_die_with_their_caller_even_while_they_import(tmp_path):
    """A caller SIGKILLed right after its pool started: its two warm workers, still importing
    JAX (made to take a minute), notice stdin's EOF and are gone within seconds."""
    hook = tmp_path / "slow_jax"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SLOW_JAX_IMPORT)
    caller = _start_caller("""
    import json, time
    import jaxflowers.sweep as sweep
    from worker_processes import sweep_workers_soon
    pool = sweep.DevicePool(2, warm_workers=True)
    print(json.dumps([p.pid for p in sweep_workers_soon(2)]), flush=True)
    time.sleep(120)
    """, tmp_path, path=[str(hook)])
    try:
        pids = json.loads(caller.stdout.readline() or "[]")
        if not (len(pids) == 2 and all(alive(pid) for pid in pids)):
            caller.kill()  # its stderr ends only with it
            pytest.fail(f"warm workers {pids}: {caller.stderr.read()}")
        caller.kill()
        caller.wait(timeout=20)
        assert gone_within(pids, 10.0), "a warm worker outlived its caller"
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()
        caller.stderr.close()


def test_the_caller_never_imports_jax(tmp_path):
    code = """
    import sys
    import jaxflowers.sweep as sweep
    import sweep_jobs
    with sweep.DevicePool(1) as pool:
        assert pool.submit(sweep_jobs.add, 1, 2).result() == 3
    assert "jax" not in sys.modules, "the pool's caller imported JAX"
    print("ok")
    """
    caller = _start_caller(code, tmp_path)
    try:
        out, err = caller.communicate(timeout=120)
    finally:
        caller.kill()
    assert caller.returncode == 0 and out.strip() == "ok", err[-2000:]


def test_a_killed_sweep_worker_fails_only_its_job_and_no_process_is_left(tmp_path):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    pool = jf.sweep.DevicePool(2, log_dir=tmp_path / "logs")
    try:
        killed = pool.submit(sweep_jobs.fail, "oom-killed")  # SIGKILL, as the OOM killer
        fine = pool.submit(sweep_jobs.add, 1, 2)
        error = killed.exception(timeout=120)
        assert isinstance(error, jf.sweep.JobError) and error.signal_name == "SIGKILL"
        assert "out of memory" in str(error) and "about to fail" in error.log_tail
        assert fine.result(timeout=120) == 3
    finally:
        pool.shutdown(wait=True)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, still_alive = psutil.wait_procs(left, timeout=5)
    assert not still_alive, still_alive


def test_warm_workers_take_the_next_jobs_and_none_outlives_the_pool(tmp_path):
    """A warm worker, launched with the pool, has imported JAX when its job comes and logs to
    the job's log; a job queued behind gets one launched when the slot's job starts; a warm
    worker killed while it waits is replaced by a fresh one; none is left at the end."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with jf.sweep.DevicePool(1, log_dir=tmp_path / "logs", warm_workers=True) as pool:
        [waiting] = sweep_workers_soon(1)
        first, second = pool.submit(sweep_jobs.worker_facts), pool.submit(sweep_jobs.worker_facts)
        facts = jf.sweep.fetch_outputs([first, second])
    assert [f["jax_preloaded"] for f in facts] == [True, True]
    assert facts[0]["ready_before_job"] is not None  # the job's start-up line can say when
    assert facts[0]["launched_before_ready"] is True  # and when the worker was launched
    assert facts[0]["pid"] == waiting.pid != facts[1]["pid"]
    logs = sorted((tmp_path / "logs").iterdir())
    assert [log.name for log in logs] == ["job-0000.log", "job-0001.log"]
    for log, f in zip(logs, facts):
        assert f"worker facts: {f}" in log.read_text()

    with jf.sweep.DevicePool(1, log_dir=tmp_path / "killed", warm_workers=True) as pool:
        [waiting] = sweep_workers_soon(1)
        waiting.kill()
        waiting.wait(timeout=10)
        facts = pool.submit(sweep_jobs.worker_facts).result(timeout=120)
        assert facts["jax_preloaded"] is False and facts["ready_before_job"] is None
        assert facts["launched_before_ready"] is None  # launched with its job
    with jf.sweep.DevicePool(2, log_dir=tmp_path / "unused", warm_workers=True):
        sweep_workers_soon(2)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, still_alive = psutil.wait_procs(left, timeout=5)
    assert not still_alive, still_alive
