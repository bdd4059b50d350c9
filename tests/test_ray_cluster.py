"""DevicePool(backend="ray") against a real ``ray start --head`` cluster.

The cluster lives in a private network namespace with only the loopback interface (and
its own process namespace, so nothing of it outlives the test and ``ray stop`` sees only
it): nothing listens beyond this machine. The cluster starts with its own PYTHONPATH; a
job must still import a module from it (the backend adds to the node's path).
"""
from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
PORT = 6399
CPUS = 24  # 3 CPU slots (one per 8 cores), where this machine's own rule would give 2

SCRIPT = """
set -e
ip link set lo up
export RAY_USAGE_STATS_ENABLED=0
PYTHONPATH="$NODE_PATH" ray start --head --node-ip-address=127.0.0.1 --port={port} \\
    --num-cpus={cpus} --num-gpus=0 --include-dashboard=false --disable-usage-stats \\
    --temp-dir="$RAY_TEMP" > "$RAY_TEMP/start.log" 2>&1
"$PYTHON" "$DRIVER" 127.0.0.1:{port}
"""


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "-n", "-p", "-f", "--mount-proc", "true"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_real_cluster_runs_cancels_keeps_its_pythonpath_and_sets_the_slots(tmp_path):
    pytest.importorskip("ray")
    if not _namespaces_work():
        pytest.skip("needs unshare -n -p (root or user namespaces) and iproute2's ip")
    node_dir = tmp_path / "node-path"
    node_dir.mkdir()
    (node_dir / "node_only.py").write_text("VALUE = 'from the node'\n")
    ray_temp = tempfile.mkdtemp(prefix="jf-ray-", dir="/tmp")  # short: Ray's socket paths
    # Token mode, as recent Ray starts clusters, with a token of the test's own (nothing
    # read from ~/.ray): `ray start` and the driver both read it from RAY_AUTH_TOKEN_PATH.
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = dict(os.environ, NODE_PATH=str(node_dir), RAY_TEMP=ray_temp, PYTHON=sys.executable,
               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
               DRIVER=str(TESTS / "ray_cluster_driver.py"),
               PATH=os.pathsep.join([str(pathlib.Path(sys.executable).parent),
                                     os.environ["PATH"]]),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]), JAX_PLATFORMS="cpu")
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
        env.pop(name, None)
    try:
        result = subprocess.run(
            ["unshare", "-n", "-p", "-f", "--mount-proc", "bash", "-c",
             SCRIPT.format(port=PORT, cpus=CPUS)],
            env=env, capture_output=True, text=True, timeout=280)
    finally:
        log = pathlib.Path(ray_temp, "start.log")
        start_log = log.read_text() if log.exists() else ""
        shutil.rmtree(ray_temp, ignore_errors=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:] + start_log
    lines = result.stdout.strip().splitlines()
    assert lines[0] == (f"Ray: joined the cluster at 127.0.0.1:{PORT}: 1 node(s), 0 GPU(s), "
                        f"{CPUS} CPU(s)")
    facts = json.loads(lines[-1])
    assert facts["slots"] == CPUS // 8 and facts["sum"] == 3 and facts["messages"] == [0, 1, 2]
    value, path = facts["node_module"]
    assert value == "from the node" and path.split(os.pathsep)[-1] == str(node_dir)
    assert facts["cancelled"] and facts["job_gone"] and facts["cancel_seconds"] < 5


class _FakeRay:
    """What ``ray_backend.join`` asks of Ray, recorded."""

    def __init__(self, error: Exception | None = None):
        self.calls, self.error = [], error

    def is_initialized(self):
        return False

    def init(self, address=None):
        self.calls.append(address)
        if self.error is not None:
            raise self.error

    def nodes(self):
        return [{"Alive": True, "Resources": {"CPU": 16.0}}, {"Alive": False}]

    def cluster_resources(self):
        return {"CPU": 16.0, "GPU": 2.0}


def test_joining_says_which_cluster_or_that_a_local_one_started(monkeypatch):
    from jaxflowers.sweep.backends.ray_cluster import join

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray = _FakeRay()
    assert join(ray, None).startswith("Ray: started a local Ray for this process (give "
                                      "address= or set RAY_ADDRESS to join a cluster): 1 "
                                      "node(s), 2 GPU(s), 16 CPU(s)")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert join(ray, None).startswith("Ray: joined the cluster at 10.0.0.1:6379: 1 node(s)")
    assert ray.calls == ["local", None]  # Ray itself reads RAY_ADDRESS


def test_a_missing_token_is_explained_in_one_sentence(monkeypatch):
    from jaxflowers.sweep.backends.ray_cluster import join

    refused = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    refused.__cause__ = RuntimeError("InvalidAuthToken: Authentication token is missing")
    with pytest.raises(ConnectionError, match=r"^the Ray cluster at 10.0.0.1:6379 requires its "
                                              r"authentication token: set RAY_AUTH_MODE=token"):
        join(_FakeRay(refused), "10.0.0.1:6379")
