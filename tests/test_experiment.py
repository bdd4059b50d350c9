"""Experiments end to end on CPU workers: a grid through the command line equals the
trainings run by hand; pruning stops a trial early; SIGKILL of a real caller and a rerun
finish only the missing trials; a 2-device trial runs beside 1-device trials.

Digits, cifar_net, one or two epochs: every trial costs a worker start, a compile (shared
through the session's compilation cache) and a few seconds of training on 2 cores.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pandas as pd
import psutil
import pytest
from PIL import Image

import jaxflowers as jf
from jaxflowers import recipes
from jaxflowers.sweep.example import example_plan

optuna = pytest.importorskip("optuna")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    """CPU only, no display, the package importable; workers see one CPU device each (the
    tests' four fake devices are dropped), LLVM -O0 as in the tests."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    path = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return dict(env, JAX_PLATFORMS="cpu", MPLBACKEND="Agg", PYTHONPATH=path,
                XLA_FLAGS="--xla_backend_optimization_level=0", **extra)


def _by_hand(depth: int, seed: int):
    """What one trial of the grid below trains, as a user would call ``train``."""
    train_set, validation_set, _ = recipes.load_plan(example_plan("digits"))
    options = recipes.recipe("digits").options(1, len(train_set), max_epochs=1, seed=seed,
                                               validation_data=validation_set, verbose=False)
    return jf.train(train_set, jf.models.cifar_net(depth), options,
                    execution=jf.ExecutionOptions(num_devices=1))


def test_a_grid_of_four_from_the_cli_equals_the_four_train_calls_run_by_hand(tmp_path):
    # Depth varies fastest: the two slots compile the two depths, the second seeds load them.
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        sweep = subprocess.Popen(
            [sys.executable, "-m", "jaxflowers", "sweep", "--recipe", "digits", "--data",
             "digits", "--param", "seed=0,1", "--param", "depth=1,2", "--epochs", "1",
             "--devices", "2", "--out", "out"], cwd=tmp_path, env=_env(), stdout=stdout,
            stderr=stderr, text=True)
        try:  # the trainings by hand run here meanwhile: the sweep leaves a core idle at times
            by_hand = {(depth, seed): _by_hand(depth, seed) for depth in (1, 2) for seed in (0, 1)}
            sweep.wait(timeout=280)
        finally:
            sweep.kill()
    result = subprocess.CompletedProcess(sweep.args, sweep.returncode,
                                         (tmp_path / "stdout").read_text(),
                                         (tmp_path / "stderr").read_text())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "out"
    lines = re.findall(r"^Trial (\d) complete: validation_accuracy ([\d.]+)% \| seed=(\d) "
                       r"depth=(\d) \| [\d.]+ s on CPU device \d \| rank \d of \d$",
                       result.stdout, re.M)
    assert sorted((int(d), int(s)) for _, _, s, d in lines) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert re.search(r"^Test accuracy of trial \d: [\d.]+% \(180 images\)$", result.stdout, re.M)
    table = jf.sweep.Experiment(recipe="digits", data="digits", out_dir=out,
                                params={"seed": [0, 1], "depth": [1, 2]},
                                options={"max_epochs": 1}).table()
    assert table["state"].tolist() == ["complete"] * 4
    assert table["objective"].is_monotonic_decreasing  # best first
    for row in table.itertuples():
        net, info = by_hand[row.depth, row.seed]
        history = np.genfromtxt(row.metrics, delimiter=",", names=True)
        np.testing.assert_array_equal(history["loss"], info.loss)
        assert row.final_validation_accuracy == info.final_validation_accuracy
        assert row.compile_time > 0 and row.train_time > 0  # where the trial's time went
        saved = jf.load(row.network)  # the trial's network is the one train returned
        for a, b in zip(jax.tree.leaves(saved.variables), jax.tree.leaves(net.variables)):
            np.testing.assert_array_equal(a, b)
    saved = json.loads((out / "experiment_results.json").read_text())
    assert saved["best"]["trial"] == int(table["trial"][0])
    assert sorted(saved["ran"]) == [0, 1, 2, 3]  # in the order they ended
    for name in ("experiment_parameters.png", "experiment_progress.png", "confusion_best.png"):
        with Image.open(out / name) as image:
            image.verify()
    assert (out / "trials.csv").read_text().count("\n") == 5


def test_pruning_stops_a_trial_early_and_the_table_says_where(tmp_path):
    """The second trial learns nothing (rate 1e-7): at its first validation it is below the
    first trial at that iteration, so the median pruner stops it there."""
    experiment = jf.sweep.Experiment(
        recipe="digits", data="digits", params={"initial_learn_rate": [1e-2, 1e-7]},
        options={"max_epochs": 1, "validation_frequency": 6}, out_dir=tmp_path,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    with jf.sweep.DevicePool(1, log_dir=tmp_path / "logs") as pool:
        result = experiment.run(pool, test=False, live=False, stream=open(os.devnull, "w"))
    table = result.table.set_index("trial")
    assert table["state"].tolist() == ["complete", "pruned"]
    assert (table["iterations"][0], table["pruned_at_iteration"][1]) == (11, 6)
    assert table["stop_reason"][1] == "pruned at iteration 6"
    assert table["objective"][1] == table["best_validation_accuracy"][1] < 15
    log = pathlib.Path(table["log"][1]).read_text()
    assert "max epochs completed" not in log and pd.isna(table["network"][1])  # stopped
    assert pathlib.Path(table["network"][0]).is_file()
    study = optuna.load_study(study_name="experiment", storage=experiment.storage_url)
    assert list(study.trials[1].intermediate_values) == [6]


_CALLER = """
import sys
import jaxflowers as jf
experiment = jf.sweep.Experiment(
    recipe="digits", data="digits", strategy="random", trials=4, seed=5,
    params={"depth": [1, 2], "seed": jf.sweep.integers(0, 1000)},
    options={"max_epochs": 1}, out_dir=sys.argv[1])
result = experiment.run(devices=2, test=False, live=False)
print("RAN", *result.ran)
print("RECOVERED", *result.recovered)
"""


def _wait_for(study_dir: pathlib.Path, complete: int, running: int, caller, timeout: float):
    # Read-only: opening the database through Optuna would create its tables, which the caller
    # may be creating at that moment.
    database = f"file:{study_dir / 'experiment.db'}?mode=ro"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and caller.poll() is None:
        try:
            with contextlib.closing(sqlite3.connect(database, uri=True)) as connection:
                states = [state for (state,) in connection.execute("SELECT state FROM trials")]
            if states.count("COMPLETE") >= complete and states.count("RUNNING") >= running:
                return
        except sqlite3.Error:  # the study is not made yet
            pass
        time.sleep(0.5)
    if caller.poll() is not None:  # it ended before that point: say why
        raise AssertionError(f"no {complete} complete and {running} running trials: the caller "
                             f"exited with code {caller.returncode}:\n"
                             f"{caller.stdout.read()[-3000:]}")
    raise AssertionError(f"no {complete} complete and {running} running trials in time")


def test_sigkill_of_the_caller_then_a_rerun_finishes_only_the_missing_trials(tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(_CALLER))
    out = tmp_path / "out"
    caller = subprocess.Popen([sys.executable, str(script), str(out)], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(out, complete=2, running=2, caller=caller, timeout=200)
    workers = psutil.Process(caller.pid).children(recursive=True)
    caller.send_signal(signal.SIGKILL)
    caller.wait(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=30)  # their stdin closed: they end
    assert not alive, "workers outlived their killed caller"
    rerun = subprocess.run([sys.executable, str(script), str(out)], env=_env(),
                           capture_output=True, text=True, timeout=250)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    ran = re.search(r"^RAN (.*)$", rerun.stdout, re.M).group(1).split()
    recovered = re.search(r"^RECOVERED ?(.*)$", rerun.stdout, re.M).group(1).split()
    assert len(ran) == 2 and len(recovered) == 2, rerun.stdout
    assert "Resuming: 2 trial(s) finished, 2 left running by a stopped caller" in rerun.stdout
    experiment = jf.sweep.Experiment(
        recipe="digits", data="digits", strategy="random", trials=4, seed=5,
        params={"depth": [1, 2], "seed": jf.sweep.integers(0, 1000)},
        options={"max_epochs": 1}, out_dir=out)
    table = experiment.table().sort_values("point")
    assert table["state"].tolist() == ["complete"] * 4
    assert table["attempts"].tolist() == [1, 1, 2, 2]  # the lost two ran again
    # The rerun drew again exactly the points it had lost: the search is the seed's.
    assert [{"depth": r.depth, "seed": r.seed} for r in table.itertuples()] == experiment.points


def test_a_two_device_trial_runs_beside_one_device_trials_on_four_devices(tmp_path):
    # The 1-device trials are the grid's depths 1 and 2 above: they load its programs.
    experiment = jf.sweep.Experiment(
        recipe="digits", data="digits", params={"num_devices": [1, 2], "depth": [1, 2]},
        trials=3, options={"max_epochs": 1}, out_dir=tmp_path)
    with jf.sweep.DevicePool(4, log_dir=tmp_path / "logs") as pool:
        result = experiment.run(pool, test=False, live=False, stream=open(os.devnull, "w"))
    table = result.table.set_index("trial").sort_index()
    assert table["where"].tolist() == ["CPU device 0", "CPU device 1", "CPU devices 2,3"]
    assert table["num_devices"].tolist() == [1, 1, 2]  # as train counted them
    assert "Training on 2 cpu devices" in pathlib.Path(table["log"][2]).read_text()
    study = optuna.load_study(study_name="experiment", storage=experiment.storage_url)
    starts = [t.datetime_start for t in study.trials]
    ends = [t.datetime_complete for t in study.trials]
    assert max(starts) < min(ends), "the three trials ran side by side"


def test_the_search_benchmark_runs_on_a_tiny_cifar10_npz(tmp_path, shared_data):
    """``benchmarks/experiment_search.py`` on an npz of 20 real CIFAR-10 JPEGs per class (its
    GPU run takes the 50,000 of the training split): one trial pruned, one not, one epoch."""
    files = [f for folder in sorted((shared_data / "cifar10-small" / "train").iterdir())
             for f in sorted(folder.glob("*.jpg"))[:20]]
    classes = sorted({f.parent.name for f in files})
    blobs = [f.read_bytes() for f in files]
    np.savez(tmp_path / "cifar10-train.npz", bytes=np.frombuffer(b"".join(blobs), np.uint8),
             offsets=np.cumsum([0, *map(len, blobs)]), classes=np.array(classes),
             labels=np.array([classes.index(f.parent.name) for f in files]))
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "experiment_search.py"), "--data",
         str(tmp_path / "cifar10-train.npz"), "--trials", "1", "--epochs", "1", "--devices",
         "1", "--out", str(tmp_path / "out")], env=_env(JAXFLOWERS_CACHE_DIR=str(tmp_path)),
        capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    record = json.loads(result.stdout)  # stdout holds the JSON alone
    assert [run["pruner"] for run in record["runs"]] == ["median", "none"]
    for run in record["runs"]:
        assert len(run["trials"]) == 1 and run["wall_time_s"] > 0
        assert 0 <= run["best_validation_accuracy"] <= 100
        assert run["cache_entries"] > 0 and run["compile_time_s"] > 0
    points = [sorted((t["depth"], t["initial_learn_rate"]) for t in run["trials"])
              for run in record["runs"]]
    assert points[0] == points[1], "both runs search the same points"
    assert record["device_kind"] == "cpu" and record["batch_per_device"] == 128
    assert len(list((tmp_path / "out" / "cifar10-train").rglob("*.jpg"))) == 200
    logs = sorted((tmp_path / "out").rglob("job-*.log"))  # every trial's, and the test job's
    assert len(logs) >= 2 and all(
        "data listed by the caller" in log.read_text() for log in logs if "Start-up" in
        log.read_text()), "a trial listed the data folder again"
    assert sum("Start-up" in log.read_text() for log in logs) == 2
