"""Several processes on 127.0.0.1 (jax.distributed, gloo CPU collectives): same numbers as one.

Each worker (``tests/distributed_worker.py``) is its own process group with 2 fake CPU
devices; this process, with conftest's 4, computes the one-process reference.
"""
import contextlib
import dataclasses
import importlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import distributed_worker as worker
import jax
import numpy as np
import pytest

from jaxflowers.distributed import join as distributed

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = pathlib.Path(__file__).with_name("distributed_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _processes(task: str, out: pathlib.Path, count: int = 2):
    """``count`` workers of ``task``, stdout/stderr in ``out``; all killed on the way out."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2",
               XLA_FLAGS="--xla_force_host_platform_device_count=2 "
                         "--xla_backend_optimization_level=0",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               JAXFLOWERS_COORDINATOR=f"127.0.0.1:{_free_port()}",
               JAXFLOWERS_NUM_PROCESSES=str(count), PYTHONUNBUFFERED="1")
    procs = []
    try:
        for i in range(count):
            with open(out / f"stdout{i}", "w") as stdout, open(out / f"stderr{i}", "w") as stderr:
                procs.append(subprocess.Popen(
                    [sys.executable, str(WORKER), task, "--out", str(out)], cwd=out,
                    env=dict(env, JAXFLOWERS_PROCESS_ID=str(i)), stdout=stdout, stderr=stderr,
                    start_new_session=True))  # its own group: killed with its children
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait(procs, out: pathlib.Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for i, proc in enumerate(procs):
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert rc == 0, f"process {i} exit {rc}:\n{(out / f'stderr{i}').read_text()[-3000:]}"


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """Both workers' results of the ``train`` task, their stdout, and the wall time."""
    out = tmp_path_factory.mktemp("two_processes")
    t0 = time.perf_counter()
    with _processes("train", out) as procs:
        _wait(procs, out, timeout=600)
    wall = time.perf_counter() - t0
    results = [dict(np.load(out / f"process{i}.npz")) for i in range(2)]
    stdout = [(out / f"stdout{i}").read_text() for i in range(2)]
    print(f"\ntwo processes x 2 CPU devices, train task: {wall:.1f} s wall, "
          f"{1e3 * float(results[0]['step_time']):.1f} ms per step")
    return results, stdout


@pytest.fixture(scope="module")
def one_process():
    """The reference: this process, 4 devices, the same global batch."""
    net, info = worker.train_tiny("resident", verbose=False)
    net_s, info_s = worker.train_stopped()
    print(f"\none process x 4 CPU devices: {1e3 * info.train_time / len(info.loss):.1f} ms "
          "per step")
    return net, info, net_s, info_s


def _assert_close(flat: dict, prefix: str, tree, rtol=1e-5):
    """Leaf-wise ||a - b|| <= rtol ||b|| for the worker's flattened ``prefix`` leaves."""
    for path, b in jax.tree_util.tree_leaves_with_path(tree):
        a = flat[prefix + jax.tree_util.keystr(path)].astype(np.float64)
        b = np.asarray(b, np.float64)
        assert np.linalg.norm(a - b) <= rtol * np.linalg.norm(b), jax.tree_util.keystr(path)


@pytest.mark.slow
@pytest.mark.parametrize("process", [0, 1])
def test_two_processes_train_the_numbers_of_one(two_processes, one_process, process):
    results, _ = two_processes
    net, info, net_s, info_s = one_process
    mine = results[process]
    assert int(mine["num_devices"]) == 4
    _assert_close(mine, "resident", net.variables)
    _assert_close(mine, "stream", net_s.variables)
    np.testing.assert_allclose(mine["loss"], info.loss, rtol=1e-5)
    np.testing.assert_allclose(mine["stream_loss"], info_s.loss, rtol=1e-5)
    assert len(info_s.loss) < 6 and info_s.stopped_early and bool(mine["stream_stopped"])
    assert not np.allclose(info.loss[0], info.loss[-1])  # the steps really trained


@pytest.mark.slow
def test_two_processes_write_checkpoints_that_one_process_resumes(two_processes):
    """The checkpoint the two processes wrote together (orbax, every process taking part)
    is complete, and one process continuing from it gets the two processes' network."""
    results, _ = two_processes
    checkpoint = pathlib.Path(str(results[0]["checkpoint"]))
    assert str(results[1]["checkpoint"]) == str(checkpoint) and checkpoint.name == "iteration_3"
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == [
        "iteration_1", "iteration_2", "iteration_3"]
    net, info = worker.train_tiny("resident", verbose=False, resume=checkpoint)
    assert len(info.loss) == 3  # nothing left to train: the history is the checkpoint's
    np.testing.assert_allclose(info.loss, results[0]["loss"], rtol=0)
    _assert_close(results[0], "resident", net.variables, rtol=1e-6)


@pytest.mark.slow
def test_prediction_over_processes_scores_every_sample_once(two_processes, one_process):
    results, _ = two_processes
    scores = [r["scores"] for r in results]
    assert scores[0].shape == (13, 3)  # 13 over 4 devices: padded, then cut back
    np.testing.assert_array_equal(scores[0], scores[1])  # every process gets them all
    # Row i is image i's score: the workers' net, predicted in this one process, agrees.
    reference = one_process[0]
    variables = jax.tree_util.tree_map_with_path(
        lambda path, _: results[0]["resident" + jax.tree_util.keystr(path)], reference.variables)
    net = dataclasses.replace(reference, variables=variables)
    np.testing.assert_allclose(scores[0], worker.predict_ragged(net), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_only_process_zero_prints_and_refusals_are_clear(two_processes):
    results, stdout = two_processes
    assert "Training on 4 cpu devices in 2 processes" in stdout[0] and "|   Epoch" not in stdout[1]
    assert "Training on" not in stdout[1]
    for r in results:
        assert "already called" in str(r["second_call_error"])
        assert 'strategy="pmap" runs on one process only' in str(r["pmap_error"])


def test_the_lost_process_line_is_last_and_whole_beside_a_half_printed_traceback():
    """The main thread may be printing a traceback (a collective the lost process broke) when
    the watch stops the process: the error line still starts a line and ends the output."""
    script = (
        "import sys\n"
        "from jaxflowers.distributed import checkin\n"
        "sys.stderr.write('Traceback (most recent call last):\\n  File x\\n        ')\n"
        "checkin._stop('process 1 was lost')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "error: process 1 was lost", result.stderr


@pytest.mark.slow
def test_a_lost_process_is_named_by_the_others_at_once(tmp_path):
    with _processes("forever", tmp_path) as procs:
        deadline = time.monotonic() + 300
        while "iteration 3\n" not in (tmp_path / "stdout0").read_text():
            assert procs[0].poll() is None and procs[1].poll() is None, \
                (tmp_path / "stderr0").read_text()[-3000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        os.killpg(procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        rc = procs[0].wait(timeout=90)
        waited = time.monotonic() - killed
    stderr = (tmp_path / "stderr0").read_text()
    print(f"\nsurvivor exited {waited:.1f} s after the other process was killed (rc {rc})")
    # The check-in connection closes with the killed process: the survivor names it at once
    # and ends, before JAX's heartbeat timeout would abort it with a C++ stack trace.
    assert rc == 1 and waited < 10, stderr[-3000:]
    assert stderr.splitlines()[-1] == ("error: process 1 was lost (it ended without "
                                       "finishing; killed, out of memory or its host down?); "
                                       "stopping process 0 too"), stderr[-3000:]
    assert "Check failure stack trace" not in stderr


@pytest.mark.slow
def test_sigterm_to_one_process_stops_every_process_at_the_same_point(tmp_path):
    """A scheduler may signal one host's process first: the others hear of it at the next
    sync point, so all stop together, each with the final checkpoint written jointly."""
    with _processes("terminated", tmp_path) as procs:
        deadline = time.monotonic() + 300
        while "iteration 3\n" not in (tmp_path / "stdout0").read_text():
            assert procs[0].poll() is None and procs[1].poll() is None, \
                (tmp_path / "stderr0").read_text()[-3000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        os.kill(procs[1].pid, signal.SIGTERM)
        codes = [proc.wait(timeout=120) for proc in procs]
    results = [[line for line in (tmp_path / f"stdout{i}").read_text().splitlines()
                if line.startswith("RESULT")] for i in range(2)]
    assert codes == [0, 0], [(tmp_path / f"stderr{i}").read_text()[-2000:] for i in range(2)]
    (stop0, n0, checkpoint0), (stop1, n1, checkpoint1) = (r[0].split()[1:] for r in results)
    assert stop0 == stop1 == "terminated" and n0 == n1
    assert checkpoint0 == str(tmp_path / "checkpoints" / f"iteration_{n0}")


def _cli(args: list[str], tmp_path, **popen):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "jaxflowers", "train", *args], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, **popen)


def test_processes_that_never_join_are_named_within_the_timeout(tmp_path):
    """Processes 0 and 1 of 3 start, process 2 never does: both say so in one line. (The
    timeout leaves room for process 1 to import JAX on a loaded machine before process 0
    gives up.)"""
    address = f"127.0.0.1:{_free_port()}"
    start = time.monotonic()
    procs = [_cli(["--coordinator", address, "--num-processes", "3", "--process-id", str(i),
                   "--init-timeout", "10"], tmp_path) for i in (0, 1)]
    try:
        outputs = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    waited = time.monotonic() - start
    line = (f"error: process 2 of 3 never joined the coordinator at {address} within 10 s; "
            "start every process with the same command and its own id")
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 2 and err.strip().splitlines() == [line], err[-3000:]
    assert waited < 45


@pytest.mark.parametrize("args, message", [
    (["--num-processes", "2"], "error: --coordinator, --process-id missing: a plain launch "
                               "needs --coordinator, --num-processes and --process-id"),
    (["--coordinator", "10.0.0.1", "--num-processes", "2", "--process-id", "0"],
     "error: --coordinator '10.0.0.1' must be HOST:PORT, e.g. 10.0.0.1:1234"),
    (["--coordinator", "h:1", "--num-processes", "2", "--process-id", "2"],
     "error: --process-id 2 must lie in 0..1 (--num-processes 2)"),
])
def test_bad_distributed_flags_give_one_line(tmp_path, args, message):
    proc = _cli(args, tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err[-3000:]
    assert err.startswith(message), err


def test_a_timeout_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match=r"initialization_timeout \(--init-timeout\) 0 must be"):
        distributed.initialize("h:1", 2, 0, initialization_timeout=0)


def test_a_process_id_used_twice_is_refused_by_name(tmp_path):
    address = f"127.0.0.1:{_free_port()}"
    procs = [_cli(["--coordinator", address, "--num-processes", "3", "--process-id", str(i),
                   "--init-timeout", "20"], tmp_path) for i in (0, 1, 1)]
    try:
        errors = [proc.communicate(timeout=60)[1] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert all(proc.returncode == 2 for proc in procs), errors
    assert "claimed process id 1, but the ids are 1..2 besides process 0, each used once" \
        in errors[0]


def test_initialize_after_jax_started_is_refused():
    jax.devices()  # starts the backends
    with pytest.raises(RuntimeError, match="must run before anything starts JAX's backends"):
        distributed.initialize("127.0.0.1:1", 2, 0)


def test_cli_initializes_before_anything_else(monkeypatch):
    from jaxflowers import cli

    calls = []

    def fake_initialize(*args, **kwargs):
        assert kwargs == {"initialization_timeout": 120.0}
        calls.append(args)
        raise SystemExit(7)  # stop before any data loads

    with pytest.warns(DeprecationWarning, match="jaxflowers.distributed.initialize"):
        assert importlib.import_module("jaxflowers.parallel").initialize is distributed.initialize
    monkeypatch.setattr(distributed, "initialize", fake_initialize)
    with pytest.raises(SystemExit, match="7"):
        cli.main(["train", "--coordinator", "10.0.0.1:1234", "--num-processes", "2",
                  "--process-id", "1"])
    assert calls == [("10.0.0.1:1234", 2, 1)]


def test_environment_variables_name_the_processes(monkeypatch):
    monkeypatch.setenv(distributed.PROCESS_ID_ENV, "x")
    with pytest.raises(ValueError, match=r"\$JAXFLOWERS_PROCESS_ID='x' is not an integer"):
        distributed.resolve("h:1", 2, None)
    monkeypatch.setenv(distributed.NUM_PROCESSES_ENV, "4")
    monkeypatch.setenv(distributed.PROCESS_ID_ENV, "3")
    monkeypatch.setenv(distributed.COORDINATOR_ENV, "10.0.0.1:99")
    assert distributed.resolve(None, None, None) == ("10.0.0.1:99", 4, 3)
    assert distributed.resolve(None, 2, 1) == ("10.0.0.1:99", 2, 1)  # arguments win
