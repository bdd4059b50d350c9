"""jaxflowers.sweep.example.ends: each job's outputs taken as it ends, while others train."""
from __future__ import annotations

import concurrent.futures
import io
import time
import types

import numpy as np
import pytest
from PIL import Image

import jaxflowers as jf
from jaxflowers import recipes
from jaxflowers.sweep.example import example_plan
from jaxflowers.sweep.example import report as results
from jaxflowers.sweep.example.ends import BestTest, JobEnds

DIGITS = tuple(str(d) for d in range(10))


@pytest.fixture(scope="module")
def plan():
    return example_plan("digits", seed=0)


@pytest.fixture(scope="module")
def test_set(plan):
    return recipes.load_plan(plan)[2]


def info(validation_accuracy: float, stop_reason: str = "max epochs") -> jf.TrainingInfo:
    steps = np.arange(1, 4)
    return jf.TrainingInfo(steps, steps, np.ones(3), np.ones(3), np.ones(3), steps[-1:],
                           np.ones(1), np.array([validation_accuracy]), stop_reason=stop_reason,
                           stopped_by=jf.StopReason.DIVERGED if "NaN" in stop_reason
                           else jf.StopReason.MAX_EPOCHS)


def output(test_set, accuracy: float, right: float, seed: int, **kwargs):
    """A job's ``(net, info, test codes)``: a share ``right`` of the test set predicted right."""
    rng = np.random.default_rng(seed)
    truth = np.asarray(test_set.labels)
    codes = np.where(rng.random(truth.size) < right, truth, rng.integers(0, 10, truth.size))
    net = types.SimpleNamespace(class_names=DIGITS)
    return net, info(accuracy, **kwargs), codes.astype(np.int32)


def wait_for(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def png_of(test: BestTest, path) -> bytes:
    test.save(path)
    return path.read_bytes()


def test_a_job_that_ends_early_is_written_and_the_best_so_far_tested_before_the_last(
        plan, test_set, tmp_path):
    """Job 1 (the best) ends while job 0 still runs: its CSV is there and its chart drawn at
    once; at the end the chart file is the one a fresh test of job 1 writes."""
    futures = [concurrent.futures.Future() for _ in range(3)]
    ends = JobEnds(futures, (1, 2, 3), plan, tmp_path)
    outputs = [output(test_set, 60.0, 0.6, 0), output(test_set, 80.0, 0.8, 1),
               output(test_set, 70.0, 0.7, 2)]
    futures[1].set_result(outputs[1])
    assert wait_for(lambda: (tmp_path / "metrics-job1.csv").exists())
    assert wait_for(lambda: ends.best_so_far is not None and ends.best_so_far.drawn)
    assert ends.best_so_far.position == 1  # drawn before the other jobs end
    futures[2].set_exception(RuntimeError("job 2 raised X\nTraceback"))
    futures[0].set_result(outputs[0])
    got, outcomes = ends.results()
    assert [o.status for o in outcomes] == ["done", "done", "failed"]
    assert outcomes[2].error == "job 2 raised X" and got[2] is None
    assert ends.metrics == {0: "metrics-job0.csv", 1: "metrics-job1.csv"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics-job0.csv",
                                                          "metrics-job1.csv"]
    best = results.print_outcomes(outcomes, results.ProgressTable((1, 2, 3), io.StringIO()),
                                  io.StringIO())
    test = ends.test(best, got)
    assert best == 1 and test.drawn and test.depth == 2  # the one drawn as job 1 ended
    truth = np.asarray(test_set.labels)
    assert test.accuracy == pytest.approx(100 * np.mean(outputs[1][2] == truth))
    assert test.facts == {"test_accuracy": test.accuracy, "test_images": len(test_set)}
    fresh = BestTest(1, 2, test_set, outputs[1][2], DIGITS)
    assert png_of(test, tmp_path / "a.png") == png_of(fresh, tmp_path / "b.png")
    with Image.open(tmp_path / "a.png") as image:
        assert image.format == "PNG" and min(image.size) > 200


@pytest.mark.parametrize("order, best", [
    ((0, 1), 1),  # the last job is the best: tested as it ends
    ((1, 0), 0),  # equal accuracies: the first job, as MATLAB's max, though it ends last
])
def test_the_job_tested_is_the_one_print_outcomes_chooses(plan, test_set, tmp_path, order,
                                                          best):
    futures = [concurrent.futures.Future() for _ in range(2)]
    ends = JobEnds(futures, (3, 4), plan, tmp_path)
    accuracies = (70.0, 90.0) if best == 1 else (75.0, 75.0)
    outputs = [output(test_set, accuracies[k], 0.5 + k / 10, k) for k in range(2)]
    for k in order:
        futures[k].set_result(outputs[k])
    got, outcomes = ends.results()
    chosen = results.print_outcomes(outcomes, results.ProgressTable((3, 4), io.StringIO()),
                                    io.StringIO())
    assert chosen == best
    test = ends.test(chosen, got)
    assert test.position == best and test.drawn and test.depth == (3, 4)[best]


def test_diverged_cancelled_and_undrawable_jobs_leave_the_end_to_decide(plan, test_set,
                                                                        tmp_path):
    """A diverged run is failed and never tested; a cancelled job has no CSV; a job whose
    codes cannot be scored fails its early test quietly and the end's test says why."""
    futures = [concurrent.futures.Future() for _ in range(3)]
    ends = JobEnds(futures, (1, 2, 3), plan, tmp_path, charts=False)
    futures[0].set_result(output(test_set, 99.0, 0.9, 0,
                                 stop_reason="training loss is NaN at iteration 3"))
    futures[1].cancel()
    futures[1].set_running_or_notify_cancel()
    net, job_info, codes = output(test_set, 50.0, 0.5, 2)
    futures[2].set_result((net, job_info, codes[:5]))  # the wrong number of test codes
    got, outcomes = ends.results()
    assert [o.status for o in outcomes] == ["failed", "cancelled", "done"]
    assert ends.metrics == {0: "metrics-job0.csv", 2: "metrics-job2.csv"}
    with pytest.raises(ValueError):
        ends.test(2, got)


def test_a_result_taken_while_jobs_run_starts_no_jax_backend_in_the_caller(tmp_path):
    """Job results are rebuilt (JAX imported, the network's model built) while other jobs
    still hold the GPUs: a backend started here would take GPU memory from them."""
    code = """
import json, pathlib, sys
import numpy as np
import jaxflowers as jf
from jaxflowers.sweep import transfer
from jaxflowers.sweep.example import example_plan
from jaxflowers.sweep.example.ends import JobEnds
from jaxflowers.sweep.futures import JobFuture
from jax._src.xla_bridge import backends_are_initialized

plan = example_plan("digits")
steps = np.arange(1, 4)
info = jf.TrainingInfo(steps, steps, *(np.ones(3),) * 3, steps[-1:], np.ones(1), np.ones(1))
net = jf.TrainedNet(jf.models.cifar_net(1, 10), {"params": {"w": np.ones(2)}},
                    tuple(map(str, range(10))), (np.zeros(3, np.float32),
                    np.ones(3, np.float32)), (32, 32, 3))
arrays = {}
tree = json.loads(json.dumps(transfer.encode_tree((net, info, np.zeros(180, np.int32)), arrays,
                                                  what="result")))
future = JobFuture(0, stop_job=lambda index: False, job_running=lambda index: False)
ends = JobEnds([future], (1,), plan, pathlib.Path(sys.argv[1]))
future.set_result(transfer.decode_tree(tree, arrays.__getitem__))  # as the pool sets it
outputs, outcomes = ends.results()
assert type(outputs[0][0]) is jf.TrainedNet and ends.best_so_far.drawn
assert not backends_are_initialized(), "the caller started a JAX backend"
"""
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_metrics_file_that_cannot_be_written_is_warned_once_and_the_rest_go_on(
        plan, test_set, tmp_path, capfd):
    blocked = tmp_path / "metrics-job0.csv"
    blocked.mkdir()  # a folder where job 0's file goes
    futures = [concurrent.futures.Future() for _ in range(2)]
    ends = JobEnds(futures, (1, 2), plan, tmp_path, charts=False)
    for k in range(2):
        futures[k].set_result(output(test_set, 50.0 + k, 0.5, k))
    got, outcomes = ends.results()
    assert [o.status for o in outcomes] == ["done", "done"]
    assert ends.metrics == {1: "metrics-job1.csv"}
    warnings = [line for line in capfd.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and str(blocked) in warnings[0], warnings
