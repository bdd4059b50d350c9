"""jaxflowers.sweep.example.run: MATLAB's parfeval example end to end, through the CLI.

The end-to-end runs train two small networks in two worker processes on the CPU; the
fast tests check the data plans, the table, the choice of the best network and that the
caller imports no JAX before its jobs start.
"""
from __future__ import annotations

import io
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import types

import pytest
from PIL import Image

from jaxflowers import recipes
from jaxflowers.sweep.example import example_plan
from jaxflowers.sweep.example import report as results

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    """The CLI's environment: CPU only, no display, and the package importable.

    Each job trains on one CPU device (conftest's four fake devices are dropped: two jobs
    share two cores already). LLVM -O0 stays: it takes a job's compile from 10 s to 5 s and
    its 22 steps from 5 s to 8 s.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    path = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return dict(env, JAX_PLATFORMS="cpu", MPLBACKEND="Agg", PYTHONPATH=path,
                XLA_FLAGS="--xla_backend_optimization_level=0", **extra)


def _sweep_cli(args: list[str], cwd: pathlib.Path, timeout: float = 300, **env):
    return subprocess.run([sys.executable, "-m", "jaxflowers", "sweep", *args], cwd=cwd,
                          env=_env(**env), capture_output=True, text=True, timeout=timeout)


def _check_outputs(out: str, depths: list[int], folder: pathlib.Path) -> dict[int, float]:
    """Assert what every sweep prints and saves; returns depth -> final validation %."""
    for job, depth in enumerate(depths):  # the live table: a row per job and validation
        rows = re.findall(rf"^\s+{job}\s+{depth}\s+(\d+)\s+\d+\s+[\d.]+%\s+[\d.]+%\s+[\d.]+$",
                          out, re.M)
        assert rows and rows[0] == "1", out
    final = {int(d): float(a) for d, a in
             re.findall(r"^  job \d+ \(depth (\d+)\): ([\d.]+)% \(compile [\d.]+ s, "
                        r"training [\d.]+ s; "
                          r"first step at [\d.]+ s, done at [\d.]+ s\)$", out, re.M)}
    assert sorted(final) == sorted(depths), out
    best = int(re.search(r"^Best network: depth (\d+)", out, re.M).group(1))
    assert final[best] == max(final.values())
    test = float(re.search(r"^Test accuracy of depth (\d+): ([\d.]+)%", out, re.M).group(2))
    assert 0.0 <= test <= 100.0
    for name in ("confusion_best.png", "sweep_progress.png"):
        with Image.open(folder / name) as image:
            image.verify()  # a complete, valid PNG
            assert image.format == "PNG" and min(image.size) > 200
    saved = json.loads((folder / "sweep_results.json").read_text())
    assert {j["depth"]: j["final_validation_accuracy"] for j in saved["jobs"]} == \
        pytest.approx(final, abs=0.006)
    assert saved["best"]["depth"] == best and saved["best"]["test_accuracy"] == \
        pytest.approx(test, abs=0.006) and not saved["interrupted"]
    return final


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cli_sweep_on_digits_trains_both_depths_and_tests_the_best(tmp_path):
    """Without --out everything goes into a new run folder under runs/, nothing beside it.
    One epoch: the jobs are the sweep notebook's, whose compiled programs they load."""
    result = _sweep_cli(["--depths", "1", "2", "--data", "digits", "--epochs", "1",
                         "--option", "steps_per_dispatch=1"], tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    folder = tmp_path / re.match(r"Run folder: (runs/\S+-sweep)\n", result.stdout).group(1)
    assert os.listdir(tmp_path) == ["runs"] and os.listdir(tmp_path / "runs") == [folder.name]
    final = _check_outputs(result.stdout, [1, 2], folder)
    for job in (0, 1):  # one epoch, validated at its end: its last iteration's row
        assert re.search(rf"^\s+{job}\s+{job + 1}\s+1\s+11\s", result.stdout, re.M)
    logs = sorted((folder / "sweep-logs").glob("job-*.log"))
    assert len(logs) == 2 and "Training on 1 cpu device" in logs[0].read_text()
    assert all(re.search(r"^Predicted the \d+ test images$", log.read_text(), re.M)
               for log in logs)
    assert all(0 <= a <= 100 for a in final.values())
    for log in logs:  # where each job's start-up and end went, in order, from its launch
        line = re.search(r"^Start-up, seconds after the job reached its worker: (.*)$",
                         log.read_text(), re.M)
        marks = dict(re.findall(r"([a-zA-Z' ]+?) ([\d.]+)(?:, |$)", line.group(1)))
        assert list(marks) == ["job function", "imports", "data", "JAX's devices", "first step"]
        times = [float(t) for t in marks.values()]
        assert times == sorted(times) and 0 < times[0] < times[-1] < 120, line.group(0)
        end = re.search(r"^End, seconds after the job reached its worker: (.*)$",
                        log.read_text(), re.M)
        ends = dict(re.findall(r"([a-z ]+?) ([\d.]+)(?:, |$)", end.group(1)))
        assert list(ends) == ["last step", "network returned", "test predicted",
                              "result written"], end.group(0)
        end_times = [float(t) for t in ends.values()]
        assert times[-1] <= end_times[0] and end_times == sorted(end_times), end.group(0)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cli_sweep_on_real_photos_in_train_and_test_folders(tmp_path, shared_data):
    """Real CIFAR-10 JPEGs in train/ and test/ class folders: 10% of train/ validates and
    test/ tests, as with CIFAR-10. A linked subset (60 + 20 per class) keeps it short."""
    photos = tmp_path / "photos"
    for part, count in (("train", 60), ("test", 20)):
        for folder in sorted((shared_data / "cifar10-small" / part).iterdir()):
            (photos / part / folder.name).mkdir(parents=True)
            for file in sorted(folder.glob("*.jpg"))[:count]:
                (photos / part / folder.name / file.name).symlink_to(file)
    (tmp_path / "tmp").mkdir()
    result = _sweep_cli(["--depths", "1", "--data", str(photos), "--epochs", "2",
                         "--out", "out"], tmp_path, JAXFLOWERS_CACHE_DIR=str(tmp_path / "cache"),
                        TMPDIR=str(tmp_path / "tmp"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert os.listdir(tmp_path / "tmp") == []  # the listings and the pool's scratch are gone
    _check_outputs(result.stdout, [1], tmp_path / "out")
    assert re.search(r"^Test accuracy of depth 1: [\d.]+% \(200 images\)$", result.stdout, re.M)
    # The caller built both caches before the job started; the job only opened them.
    assert re.search(r"^Prepared the data in [\d.]+ s \(800 images in 2 resize cache\(s\)\)$",
                     result.stdout, re.M), result.stdout
    assert "Resizing 600 images" in result.stderr and "Resizing 200 images" in result.stderr
    [log] = (tmp_path / "out" / "sweep-logs").glob("job-*.log")
    assert "Training on 1 cpu device" in log.read_text() and "Resizing" not in log.read_text()
    # ... and took the caller's listing of them instead of listing 800 files again.
    assert re.search(r"^Start-up, .*, data listed by the caller [\d.]+, ", log.read_text(),
                     re.M), log.read_text()
    # The job predicted its own test set (the caller only scores the best job's classes).
    assert "Predicted the 200 test images" in log.read_text()


def test_cli_sweep_without_prepared_cifar10_says_what_to_use_instead(tmp_path):
    result = _sweep_cli(["--depths", "1", "--data", "cifar10"], tmp_path, timeout=120,
                        TFDS_DATA_DIR=str(tmp_path / "tfds"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not prepared" in result.stderr and "--data digits" in result.stderr
    assert not (tmp_path / "sweep-logs").exists()  # failed before any job started


def test_the_caller_imports_no_jax_before_its_jobs_start(tmp_path):
    """Not before the jobs start (a GPU backend would hold memory their workers need), but
    in the background once one has taken a step, so fetching the results does not wait."""
    code = ("import sys\nfrom jaxflowers.cli.entry import main\n"
            "from jaxflowers.sweep import DevicePool\n"
            "from jaxflowers.sweep.example import example_plan\n"
            "from jaxflowers.sweep.example import run as example\n"
            "plan = example_plan('digits')\n"
            "from jaxflowers.sweep.jobs import job_options\n"
            "job_options({'steps_per_dispatch': 1, 'augmentation': {'reflect_x': True}})\n"
            "from jaxflowers.sweep.events import Relay\n"
            "with DevicePool(1, log_dir='logs') as pool:\n"
            "    relay = pool.after_each(Relay())\n"
            "    pool.submit(example.depth_job, data=plan, depth=1).cancel()\n"
            "    example._watch(pool, relay, (1,), sys.stdout)\n"
            "assert 'jax' not in sys.modules, 'jax imported'\n"
            # a job's first step: the results' modules load meanwhile, in a thread
            "relay(0, {'state': 'iteration', 'iteration': 1})\n"
            "import threading, time\n"
            "[t.join(60) for t in threading.enumerate() if t.name == 'jaxflowers-result-imports']\n"
            "assert 'jax' in sys.modules and 'jaxflowers.inference.net' in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_caller_builds_the_folder_caches_without_importing_jax(tmp_path, monkeypatch,
                                                                   count_decodes):
    photos = tmp_path / "photos"
    for part, count in (("train", 10), ("test", 2)):
        for c, name in enumerate(("cat", "dog")):
            (photos / part / name).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (40, 30), (100 * c, 20 * i, 50)).save(
                    photos / part / name / f"{i}.png")
    code = ("import sys\nfrom jaxflowers import recipes\n"
            "from jaxflowers.sweep.example import example_plan\n"
            f"plan = example_plan({str(photos)!r})\n"
            f"plan, folders = recipes.share_plan(plan, {str(tmp_path)!r})\n"
            "assert 'jax' not in sys.modules, 'preparing the data imported jax'\n"
            "print(*(len(f) for f in folders), *sorted(plan['listings']))\n")
    cache = tmp_path / "cache"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            env=_env(JAXFLOWERS_CACHE_DIR=str(cache)), text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["20", "4", "test", "train"]
    assert "Resizing 20 images" in result.stderr
    assert "\r" not in result.stderr  # a log gets a line per resize, not a bar
    monkeypatch.setenv("JAXFLOWERS_CACHE_DIR", str(cache))
    train, validation, test = recipes.load_plan(example_plan(str(photos)))  # a job's load
    assert sum(len(s.images) for s in (train, validation, test)) == 24
    assert count_decodes == [], "a job must find every cache built"
    (photos / "test" / "dog" / "1.png").write_bytes(b"not a png")
    with pytest.raises(recipes.DataUnavailableError, match=r"cannot prepare .*test.*dog/1\.png"):
        recipes.prepare_plan(example_plan(str(photos)))


def test_data_plans_pass_data_by_reference(tmp_path, shared_data):
    assert example_plan("digits", seed=3) == {"source": "digits", "fractions": [0.8, 0.1],
                                              "seed": 3, "image_size": [32, 32]}
    photos = shared_data / "cifar10-small"
    split = example_plan(str(photos))
    assert split["train"] == str(photos / "train") and split["image_size"] == [32, 32]
    assert split["test"] == str(photos / "test") and split["validation"] == 0.1
    assert recipes.describe_plan(split) == (f"{photos}/train for training and {photos}/test for "
                                    "testing, 10% of each training class held out for "
                                    "validation (seed 0)")
    flat = example_plan(str(photos / "train"))
    assert flat["source"] == str(photos / "train")
    with pytest.raises(recipes.DataUnavailableError, match="neither"):
        example_plan(str(tmp_path / "missing"))


def test_load_sets_splits_digits_three_ways_and_deterministically():
    digits = example_plan("digits", seed=1)
    train, validation, test = recipes.load_plan(digits)
    assert (len(train), len(validation), len(test)) == (1438, 179, 180)
    assert recipes.describe_plan(digits).startswith(
        "the handwritten digits embedded in scikit-learn")
    again = recipes.load_plan(digits)[2]
    assert (again.images == test.images).all() and set(test.labels) == set(range(10))


def test_progress_table_prints_validations_job_times_and_failures_in_its_columns():
    stream = io.StringIO()
    table = results.ProgressTable((1, 3), stream, start=time.perf_counter() - 2.0)
    table(0, {"state": "start", "iteration": 0, "epoch": 0})
    table(0, {"state": "iteration", "iteration": 5, "epoch": 1, "accuracy": 40.0})
    table(1, {"state": "validation", "iteration": 11, "epoch": 1, "accuracy": 38.28125,
              "validation_accuracy": 23.456})
    table(0, {"state": "done", "iteration": 5, "epoch": 1})
    table(0, {"state": "failed", "error": "job 0 raised ValueError: bad"})
    table(1, {"state": "cancelled"})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 5
    ends = {re.search(r"\d+\.\d(?=  |$)", line).end() for line in lines}
    assert len(ends) == 1  # every line's seconds end in one column
    assert lines[0].split()[:2] == ["0", "1"] and lines[0].split()[3] == "started"
    assert lines[1].split()[:6] == ["1", "3", "1", "11", "38.28%", "23.46%"]
    assert lines[2].split()[3] == "done"
    assert lines[3].split()[3:] == ["failed:", "job", "0", "raised", "ValueError:", "bad"]
    assert lines[4].split()[3] == "cancelled"
    assert 2.0 <= table.began[0] <= table.ended[0] < 60 and 1 not in table.began


def test_the_best_network_skips_failed_diverged_and_cancelled_jobs():
    stream = io.StringIO()
    table = results.ProgressTable((1, 2, 3, 4), io.StringIO(), start=0.0)
    table.began[1], table.ended[1] = 4.0, 9.5
    info = types.SimpleNamespace(final_validation_accuracy=71.5, compile_time=1.25,
                                 train_time=5.0)
    diverged = types.SimpleNamespace(final_validation_accuracy=99.0, compile_time=1.0,
                                     train_time=1.0)
    outcomes = [results.JobOutcome(0, 1, None, "job 0 raised X"),
                results.JobOutcome(1, 2, info), results.JobOutcome(2, 3, None, "cancelled"),
                results.JobOutcome(3, 4, diverged, "training loss is NaN at iteration 7")]
    assert results.print_outcomes(outcomes, table, stream) == 1
    assert "job 2 (depth 3): cancelled" in stream.getvalue()
    assert ("job 1 (depth 2): 71.50% (compile 1.2 s, training 5.0 s; first step at 4.0 s, "
            "done at 9.5 s)") in stream.getvalue()
    assert "job 3 (depth 4): training loss is NaN at iteration 7 (compile" in stream.getvalue()
    assert [o.status for o in outcomes] == ["failed", "done", "cancelled", "failed"]
    assert results.print_outcomes(outcomes[2:3], table, io.StringIO()) is None
