"""Fault table of ``python -m jaxflowers sweep``: every bad input and interruption, each with
its exact outcome (the message names the argument, nothing is lost, no process is left).

Bad input is refused in the caller before any worker starts; a diverged job is a failed
job that is never chosen; Ctrl-C keeps what finished; the results are written before the
figures, and a figure that cannot be saved is a warning.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

import jaxflowers as jf
from jaxflowers.sweep.example import report as results
from jaxflowers.sweep.example.ends import job_outcome

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _env(tmp_path: pathlib.Path) -> dict:
    """CPU only, one device per job, no display; TMPDIR shows any scratch folder left."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    return dict(env, JAX_PLATFORMS="cpu", MPLBACKEND="Agg", TMPDIR=str(tmp_path / "tmp"),
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
                XLA_FLAGS="--xla_backend_optimization_level=0", PYTHONUNBUFFERED="1")


def _start(args: list[str], tmp_path: pathlib.Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "jaxflowers", "sweep", *args], cwd=tmp_path,
                            env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _no_process_left(tmp_path: pathlib.Path) -> list[str]:
    """Command lines of live processes that mention ``tmp_path`` (workers name their job
    folder, which lies under TMPDIR there)."""
    left = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and \
                    str(tmp_path) in " ".join(proc.info["cmdline"] or ()):
                left.append(" ".join(proc.info["cmdline"]))
        except psutil.Error:
            pass
    return left


REFUSED = [  # arguments -> what the one error line must say; nothing may start
    (["--option", "bogus=1"], "error: --option: unknown option 'bogus'; the command line can "
                              "set solver, initial_learn_rate, mini_batch_size, shuffle,"),
    (["--option", "output_fn=print"], "error: --option: output_fn cannot be set on the command "
                                      "line: the pool receives every job's messages"),
    (["--option", "mini_batch_size=0"], "error: --option: mini_batch_size=0 must be an integer"),
    (["--option", "solver=lbfgs"], "error: --option: solver='lbfgs' is not allowed"),
    (["--option", "steps_per_dispatch=0"],  # an ExecutionOptions field, checked as such
     "error: --option: steps_per_dispatch=0 must be an integer >= 1"),
    (["--option", "strategy=bogus"], "error: --option: strategy='bogus' is not allowed"),
    (["--option", 'augmentation={"flip": true}'], "error: --option: augmentation={'flip': "),
    (["--option", "steps_per_dispatch"], "error: --option: 'steps_per_dispatch': use "
                                         "NAME=VALUE"),
    (["--depths", "0"], "argument --depths: '0' is not a positive integer"),
    (["--epochs", "-1"], "argument --epochs: '-1' is not a positive integer"),
    (["--jobs-per-device", "0"], "argument --jobs-per-device: '0' is not a positive integer"),
    (["--data", "no-such-folder"], "error: data 'no-such-folder' is neither 'cifar10', "
                                   "'digits' nor an existing folder"),
    (["--out", "a-file/out"], "error: --out: cannot write into {tmp}/a-file/out (Not a "
                              "directory)"),
]


@pytest.mark.parametrize("args, message", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_bad_input_is_refused_before_any_worker_starts(tmp_path, args, message):
    (tmp_path / "a-file").write_text("not a folder")
    proc = _start(args + ["--epochs", "1"] * ("--epochs" not in args), tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, out + err
    lines = err.strip().splitlines()
    assert message.replace("{tmp}", str(tmp_path)) in lines[-1], err
    assert "validation_data" not in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["a-file", "tmp"]  # no run folder left behind
    assert os.listdir(tmp_path / "tmp") == [] and _no_process_left(tmp_path) == []


def _info(stop_reason: str, validation_accuracy: float) -> jf.TrainingInfo:
    steps = np.arange(1, 4)
    return jf.TrainingInfo(steps, steps, np.ones(3), np.ones(3), np.ones(3), steps[-1:],
                           np.ones(1), np.array([validation_accuracy]),
                           stop_reason=stop_reason,
                           stopped_by=jf.StopReason.DIVERGED if "NaN" in stop_reason
                           else jf.StopReason.MAX_EPOCHS)


def test_a_diverged_job_is_failed_with_its_reason_and_never_the_best():
    outputs = [("net0", _info("max-epochs", 40.0), None),
               ("net1", _info("training loss is NaN at iteration 3", 95.0), None)]
    futures = []
    for output in outputs:
        futures.append(concurrent.futures.Future())
        futures[-1].set_result(output)
    outcomes = [job_outcome(k, future, depth)[1]
                for k, (future, depth) in enumerate(zip(futures, (1, 2)))]
    assert [o.status for o in outcomes] == ["done", "failed"]
    assert outcomes[1].error == "training loss is NaN at iteration 3"
    table = results.ProgressTable((1, 2), open(os.devnull, "w"))
    assert results.print_outcomes(outcomes, table, open(os.devnull, "w")) == 0
    summary = results.summary(outcomes, best=0, test=None, metrics={})
    assert summary["jobs"][1]["status"] == "failed" and summary["best"]["depth"] == 1
    assert summary["jobs"][1]["stop_reason"] == "training loss is NaN at iteration 3"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_job_whose_loss_diverges_fails_with_that_reason_and_is_not_chosen(tmp_path):
    proc = _start(["--depths", "1", "--epochs", "2", "--option", "initial_learn_rate=1e6",
                   "--option", "steps_per_dispatch=1", "--out", "out"], tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, out + err
    reason = re.search(r"^\s+0\s+1\s+[\d.]+  failed: ((?:training loss is (?:NaN|Inf)|gradient "
                       r"is not finite) at iteration (\d+))$", out, re.M)
    assert reason, out
    assert f"  job 0 (depth 1): {reason.group(1)} (compile" in out
    assert "No job finished with a validation accuracy" in out and "Best network" not in out
    [job] = json.loads((tmp_path / "out" / "sweep_results.json").read_text())["jobs"]
    assert job["status"] == "failed" and job["stop_reason"] == reason.group(1)
    assert int(reason.group(2)) <= 22, "stops within the first epochs' iterations"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum, status, words", [
    (signal.SIGINT, 130, "Interrupted"), (signal.SIGTERM, 143, "Terminated (SIGTERM)")])
def test_a_stop_signal_keeps_the_finished_jobs_and_leaves_nothing_behind(tmp_path, signum,
                                                                         status, words):
    """One CPU slot: job 0 (depth 1) finishes, then Ctrl-C (or SIGTERM, as kill, Slurm and
    Kubernetes send) while job 1 (depth 2) trains."""
    proc = _start(["--depths", "1", "2", "--epochs", "1", "--devices", "1", "--out", "out",
                   "--option", "steps_per_dispatch=1"], tmp_path)
    lines, deadline = [], time.monotonic() + 240
    for line in proc.stdout:  # the live table: job 1's first step means job 0 is done
        lines.append(line)
        cells = line.split()  # job, depth, seconds, event
        if (cells[:2] == ["1", "2"] and cells[3:4] == ["started"]) or time.monotonic() > deadline:
            break
    proc.send_signal(signum)
    rest, err = proc.communicate(timeout=60)
    out = "".join(lines) + rest
    assert proc.returncode == status, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert f"{words}: the jobs still running are cancelled" in out
    assert "  job 1 (depth 2): cancelled" in out and "Best network: depth 1 (job 0," in out
    saved = json.loads((tmp_path / "out" / "sweep_results.json").read_text())
    assert saved["interrupted"] == signal.Signals(signum).name
    assert [j["status"] for j in saved["jobs"]] == ["done", "cancelled"]
    assert saved["best"]["depth"] == 1 and 0 <= saved["best"]["test_accuracy"] <= 100
    assert (tmp_path / "out" / "sweep_progress.png").is_file()
    assert os.listdir(tmp_path / "tmp") == [], "the pool's scratch folder is left"
    assert _no_process_left(tmp_path) == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_failed_jobs_are_reported_and_saved_before_a_figure_fails(tmp_path):
    """Every job fails in its worker (a mini-batch larger than the training set, which only
    the data can tell); the progress grid cannot be saved (its path is a folder). The
    summary and sweep_results.json come first, the figure costs only a warning, exit 1.
    Without --data the sweep runs offline on the embedded digits and says so."""
    (tmp_path / "out" / "sweep_progress.png").mkdir(parents=True)
    proc = _start(["--depths", "1", "2", "--epochs", "1", "--option", "mini_batch_size=4096",
                   "--out", "out"], tmp_path)
    out, err = proc.communicate(timeout=100)
    assert proc.returncode == 1, out + err
    assert out.startswith("Run folder: out\nData: the handwritten digits embedded in "
                          "scikit-learn (1,797 images, offline), split 80% training, 10% "
                          "validation")
    for job in (0, 1):
        assert re.search(rf"^\s+{job}\s+{job + 1}\s+[\d.]+  failed: job {job} raised", out,
                         re.M), out
        assert re.search(rf"^  job {job} \(depth {job + 1}\): job {job} raised \w+", out, re.M)
    assert "No job finished with a validation accuracy" in out and "Saved" not in out
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [
        "warning: the figure could not be saved to out/sweep_progress.png: it is a folder"]
    saved = json.loads((tmp_path / "out" / "sweep_results.json").read_text())
    assert [(j["depth"], j["status"]) for j in saved["jobs"]] == [(1, "failed"), (2, "failed")]
    assert saved["jobs"][0]["error"].startswith("job 0 raised") and saved["best"] is None
    assert not (tmp_path / "out" / "confusion_best.png").exists()
    assert os.listdir(tmp_path / "tmp") == [] and _no_process_left(tmp_path) == []
