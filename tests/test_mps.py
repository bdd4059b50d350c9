"""MPS for jobs packed on a GPU: a private daemon per GPU, its environment in every worker,
stopped with the pool; a clear warning (or error) when it cannot start. A fake
``nvidia-cuda-mps-control`` stands in for the driver's (no GPU here)."""
import json
import os
import pathlib
import stat
import sys

import pytest
import sweep_jobs

from jaxflowers import sweep
from jaxflowers.host import mps
from jaxflowers.sweep.backends.local import LocalBackend

pytestmark = pytest.mark.timeout(150)

FAKE = """#!{python}
import json, os, pathlib, sys
pipe = pathlib.Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
def record(**entry):
    with open(os.environ["FAKE_MPS_RECORD"], "a") as f:
        f.write(json.dumps(entry) + "\\n")
if sys.argv[1:] == ["-d"]:
    if os.environ.get("FAKE_MPS_FAIL"):
        sys.exit("An instance of this daemon is already running")
    (pipe / "control").write_text("")
    record(start=os.environ["CUDA_VISIBLE_DEVICES"], pipe=str(pipe))
else:
    for command in sys.stdin.read().split():
        if command == "quit":
            (pipe / "control").unlink()
            record(quit=str(pipe))
"""
# The client check the pool makes: the server's socket is where the environment says.
PROBE = ("import os, sys; sys.exit(0 if os.path.exists(os.path.join("
         "os.environ['CUDA_MPS_PIPE_DIRECTORY'], 'control')) else 'no MPS server')")
NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    """Two fake GPUs and a fake control program on PATH; the file its calls are recorded in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / mps.CONTROL
    control.write_text(FAKE.format(python=sys.executable))
    control.chmod(control.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr(LocalBackend, "gpus", lambda self: ["0", "1"])
    monkeypatch.setattr(mps, "_PROBE", PROBE)
    return record


def _calls(record: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_packed_jobs_join_a_private_daemon_per_gpu_stopped_with_the_pool(fake_mps, tmp_path):
    with sweep.DevicePool("all", jobs_per_device=2, log_dir=tmp_path / "logs") as pool:
        assert pool.sharing == "mps"
        envs = sweep.fetch_outputs([pool.submit(sweep_jobs.environment_of, *NAMES)
                                    for _ in range(4)])
        started = _calls(fake_mps)
    assert sorted(call["start"] for call in started) == ["0", "1"]  # one daemon per GPU
    pipes = {call["start"]: call["pipe"] for call in started}
    assert sorted((e["CUDA_VISIBLE_DEVICES"], e["CUDA_MPS_PIPE_DIRECTORY"]) for e in envs) == \
        sorted([("0", pipes["0"])] * 2 + [("1", pipes["1"])] * 2)
    assert all(e["CUDA_MPS_LOG_DIRECTORY"].startswith(str(pathlib.Path(pipes["0"]).parents[1]))
               for e in envs)
    assert sorted(call["quit"] for call in _calls(fake_mps) if "quit" in call) == \
        sorted(pipes.values())  # both daemons asked to quit when the pool closed
    assert not pathlib.Path(pipes["0"]).exists()  # the scratch folder went with the pool


def test_one_job_per_gpu_or_mps_off_starts_no_daemon(fake_mps, tmp_path):
    with sweep.DevicePool("all", warm_workers=False, log_dir=tmp_path / "one") as pool:
        assert pool.sharing is None
        env = pool.submit(sweep_jobs.environment_of, *NAMES).result(timeout=120)
    with sweep.DevicePool("all", jobs_per_device=2, mps=False,
                          warm_workers=False, log_dir=tmp_path / "off") as pool:
        assert pool.sharing == "time-slicing"
    assert not _calls(fake_mps) and env["CUDA_MPS_PIPE_DIRECTORY"] is None


def test_a_daemon_that_cannot_start_is_a_warning_or_with_mps_true_an_error(
        fake_mps, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with pytest.warns(UserWarning, match=r"MPS could not start \(nvidia-cuda-mps-control -d for "
                                         r"GPU 0 exited with 1: An instance of this daemon is "
                                         r"already running\); the 2 jobs on each GPU take turns"):
        pool = sweep.DevicePool("all", jobs_per_device=2,
                                warm_workers=False, log_dir=tmp_path / "auto")
    with pool:
        assert pool.sharing == "time-slicing"
        env = pool.submit(sweep_jobs.environment_of, *NAMES).result(timeout=120)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] is None and env["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    with pytest.raises(mps.MpsError, match="already running"):
        sweep.DevicePool("all", jobs_per_device=2, mps=True, log_dir=tmp_path / "required")


def test_a_missing_control_program_or_a_client_that_cannot_join_is_named(
        fake_mps, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(mps.MpsError, match="nvidia-cuda-mps-control is not on PATH"):
        sweep.DevicePool("all", jobs_per_device=2, mps=True, log_dir=tmp_path / "a")
    monkeypatch.undo()
    monkeypatch.setenv("PATH", f"{fake_mps.parent / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(fake_mps))
    monkeypatch.setattr(LocalBackend, "gpus", lambda self: ["0"])
    monkeypatch.setattr(mps, "_PROBE", "import sys; sys.exit('cuInit returned 805')")
    with pytest.raises(mps.MpsError, match="a client could not join MPS on GPU 0: cuInit "
                                           "returned 805"):
        sweep.DevicePool("all", jobs_per_device=2, mps=True, log_dir=tmp_path / "b")
    assert [call for call in _calls(fake_mps) if "quit" in call]  # the daemon was stopped


def test_an_mps_server_of_the_users_own_is_left_alone(fake_mps, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "theirs"))
    with sweep.DevicePool("all", jobs_per_device=2,
                          warm_workers=False, log_dir=tmp_path / "logs") as pool:
        assert pool.sharing == "mps"
        env = pool.submit(sweep_jobs.environment_of, *NAMES).result(timeout=120)
    assert not _calls(fake_mps) and env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "theirs")


def test_bad_mps_setting():
    with pytest.raises(ValueError, match="mps='yes': use 'auto', True or False"):
        sweep.DevicePool(1, mps="yes")


def test_auto_jobs_per_device_fills_the_gpu_the_first_job_measured(fake_mps, tmp_path, capsys):
    gib = 2**30
    with sweep.DevicePool("all", warm_workers=False, jobs_per_device="auto", mps=False,
                          log_dir=tmp_path / "logs") as pool:
        assert pool.num_slots == 2 and pool.jobs_per_device == {"0": 1, "1": 1}
        # The first job on each GPU: 10 GiB of an 80 GiB GPU (its cap 0.9 of it), so
        # 0.9 * 80 // (10 * 1.25 + 1) = 5 jobs fit on each.
        futures = [pool.submit(sweep_jobs.report_memory_then_sleep, 10 * gib, int(72 * gib), 3)
                   for _ in range(10)]
        runs = [future.result(timeout=120) for future in futures]
        assert pool.jobs_per_device == {"0": 5, "1": 5} and pool.num_slots == 10
    fractions = sorted(fraction for fraction, _, _ in runs)
    assert fractions == ["0.18"] * 8 + ["0.9"] * 2  # the first two measured, uncapped
    starts, ends = [start for _, start, _ in runs], [end for _, _, end in runs]
    assert max(starts) < min(ends)  # all ten ran at once, none waited for a slot
    assert capsys.readouterr().err.count("jobs_per_device='auto': job ") == 2
    with pytest.raises(ValueError, match="jobs_per_device='auto' needs backend='local'"):
        sweep.DevicePool("all", jobs_per_device="auto", backend="ray")


def test_auto_hands_the_jobs_of_its_added_slots_to_warm_workers_with_their_cap(fake_mps,
                                                                             tmp_path):
    """The slots "auto" adds once the first job has measured itself cap the memory lower than
    the first slot; the warm workers launched meanwhile still take their jobs, and that cap."""
    gib = 2**30
    with sweep.DevicePool(1, jobs_per_device="auto", mps=False, log_dir=tmp_path) as pool:
        # the first job measures itself once all four wait, as a training's first step does
        futures = [pool.submit(sweep_jobs.report_memory_warm_then_sleep, 10 * gib,
                               int(72 * gib), 2, wait=1.0 if job == 0 else 0.0)
                   for job in range(4)]
        runs = [future.result(timeout=120) for future in futures]
        assert pool.jobs_per_device == {"0": 5}
    assert [fraction for fraction, *_ in runs] == ["0.9", "0.18", "0.18", "0.18"]
    assert [warm for *_, warm in runs] == [True] * 4


def test_auto_on_a_small_gpu_keeps_one_job(fake_mps, tmp_path):
    gib = 2**30
    with sweep.DevicePool(1, jobs_per_device="auto", mps=False, warm_workers=False,
                          log_dir=tmp_path) as pool:
        pool.submit(sweep_jobs.report_memory_then_sleep, 12 * gib, int(14.4 * gib), 0).result(
            timeout=120)
        assert pool.jobs_per_device == {"0": 1} and pool.num_slots == 1


def test_the_sweep_command_takes_auto_and_the_mps_choice():
    import subprocess

    bad = subprocess.run([sys.executable, "-m", "jaxflowers", "sweep", "--jobs-per-device",
                          "many"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "'many' is not a positive integer or auto" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "jaxflowers", "sweep", "--mps", "yes"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice: 'yes'" in bad.stderr


def test_warm_workers_launch_while_mps_starts_and_again_if_it_cannot(fake_mps, tmp_path,
                                                                    monkeypatch):
    """The client check (which starts the servers) finds the warm workers already launched;
    when it fails, those workers (launched to join MPS) are replaced by ones that take turns."""
    warm_logs = ("import os, pathlib, sys; scratch = pathlib.Path("
                 "os.environ['CUDA_MPS_PIPE_DIRECTORY']).parents[1]; ")
    monkeypatch.setattr(mps, "_PROBE", warm_logs + "sys.exit(0 if len(list(scratch.glob("
                        "'warm-*.log'))) == 4 else 'the workers were not launched yet')")
    names = ("CUDA_MPS_PIPE_DIRECTORY",)
    with sweep.DevicePool("all", jobs_per_device=2, mps=True, log_dir=tmp_path / "a") as pool:
        envs = sweep.fetch_outputs([pool.submit(sweep_jobs.environment_of, *names)
                                    for _ in range(4)])
    assert all(env["CUDA_MPS_PIPE_DIRECTORY"] for env in envs)

    monkeypatch.setattr(mps, "_PROBE", warm_logs + "sys.exit('cuInit returned 805')")
    with pytest.warns(UserWarning, match="cuInit returned 805"):
        pool = sweep.DevicePool("all", jobs_per_device=2, log_dir=tmp_path / "b")
    with pool:
        assert pool.sharing == "time-slicing"
        runs = [future.result(timeout=120) for future in
                [pool.submit(sweep_jobs.report_memory_warm_then_sleep, 0, 1, 0)
                 for _ in range(4)]]
        envs = sweep.fetch_outputs([pool.submit(sweep_jobs.environment_of, *names)
                                    for _ in range(2)])
    assert [warm for *_, warm in runs] == [True] * 4  # the replacements took them
    assert [env["CUDA_MPS_PIPE_DIRECTORY"] for env in envs] == [None, None]
