"""jaxflowers.sweep.experiment's search and table without workers: the study in SQLite,
which points remain, trials a dead caller left RUNNING, a study defined otherwise, TPE's
reproducibility, and the results table and its figure."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

optuna = pytest.importorskip("optuna")

import jaxflowers as jf  # noqa: E402
from jaxflowers.plots.experiment import parameter_chart  # noqa: E402
from jaxflowers.sweep.experiment import search as searching  # noqa: E402
from jaxflowers.sweep.experiment.session import open_search  # noqa: E402
from jaxflowers.sweep.experiment.table import frame, rows  # noqa: E402

COMPLETE, FAIL, PRUNED = (optuna.trial.TrialState[s] for s in ("COMPLETE", "FAIL", "PRUNED"))


def _experiment(tmp_path, **kwargs):
    kwargs = {"recipe": "digits", "data": "digits", "params": {"depth": [1, 2, 3]},
              "options": {"max_epochs": 1}, "out_dir": tmp_path, **kwargs}
    return jf.sweep.Experiment(**kwargs)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_rerun_skips_finished_points_and_reruns_those_a_dead_caller_left(tmp_path):
    experiment = _experiment(tmp_path)
    search = open_search(experiment)
    done, _ = search.ask(0)
    search.tell(done, COMPLETE, 50.0)
    lost, values = search.ask(1)
    assert values == {"depth": 2}
    lost.set_user_attr("owner", {"host": socket.gethostname(), "pid": _dead_pid()})
    mine, _ = search.ask(2)  # this process is alive: its trial stays taken
    again = open_search(experiment)  # a rerun
    assert again.next_point() == 1 and again.next_point([1]) is None
    assert again.recover() == [lost.number] and again.recover() == []
    states = {t.number: t.state for t in again.study.get_trials()}
    assert states == {done.number: COMPLETE, lost.number: FAIL, mine.number:
                      optuna.trial.TrialState.RUNNING}


def test_a_trial_of_another_machine_is_lost_once_its_heartbeat_is_old(tmp_path):
    search = open_search(_experiment(tmp_path))
    trial, _ = search.ask(0)
    trial.set_user_attr("owner", {"host": "elsewhere", "pid": 1})
    assert search.recover() == [] and search.next_point() == 1
    trial.set_user_attr("heartbeat", time.time() - searching.GRACE - 1)
    assert search.recover() == [trial.number] and search.next_point() == 0


def test_a_study_defined_otherwise_is_refused_naming_what_differs(tmp_path):
    open_search(_experiment(tmp_path))
    with pytest.raises(searching.DefinitionError, match=r"experiment 'experiment' in sqlite:.*"
                                                        r"defined with other params"):
        open_search(_experiment(tmp_path, params={"depth": [1, 2]}))
    open_search(_experiment(tmp_path, trials=2, pruner="median"))  # these may change
    open_search(_experiment(tmp_path, params={"depth": [1, 2]}, name="other"))


def test_bayesian_search_with_a_fixed_seed_asks_the_same_trials(tmp_path):
    """TPE's suggestions depend only on its seed and on what it was told: two studies with
    the same seed, told the same values, ask the same parameters (after the random start)."""
    asked = []
    for folder in ("a", "b"):
        experiment = _experiment(tmp_path / folder, strategy="bayesian", trials=8, seed=3,
                                 params={"initial_learn_rate": jf.sweep.loguniform(1e-4, 1e-1),
                                         "depth": [1, 2, 3, 4]})
        search, found = open_search(experiment), []
        for point in range(8):
            trial, values = search.ask(point)
            search.tell(trial, COMPLETE, -abs(np.log10(values["initial_learn_rate"]) + 2.5))
            found.append(values)
        asked.append(found)
    assert asked[0] == asked[1] and len({v["initial_learn_rate"] for v in asked[0]}) == 8


def test_the_table_has_one_row_per_point_best_first(tmp_path):
    search = open_search(_experiment(tmp_path))
    first, _ = search.ask(0)
    search.tell(first, FAIL, error="job 0 raised ValueError: boom")
    for point, state, value in ((0, COMPLETE, 40.0), (1, PRUNED, None), (2, COMPLETE, 70.0)):
        trial, _ = search.ask(point)
        if state == PRUNED:
            search.report(trial, 20.0, 6)
        search.tell(trial, state, value, where="CPU device 0",
                    **({"pruned_at_iteration": 6} if state == PRUNED else {}))
    table = frame(rows(search.study.get_trials(), ["depth"]), ["depth"], "maximize")
    assert table["depth"].tolist() == [3, 1, 2] and table["state"].tolist() == [
        "complete", "complete", "pruned"]
    assert table["objective"].tolist() == [70.0, 40.0, 20.0]  # pruned: its last report
    assert table["attempts"].tolist() == [1, 2, 1] and table["pruned_at_iteration"][2] == 6
    assert str(table["iterations"].dtype) == "Int64"
    chart = parameter_chart(table, ["depth"], label="validation_accuracy")
    chart.savefig(tmp_path / "chart.png")
    with Image.open(tmp_path / "chart.png") as image:
        assert image.size[0] > 300
    assert chart.axes[0].get_ylabel() == "validation_accuracy"
    assert [t.get_text() for t in chart.axes[0].get_xticklabels()] == ["1", "2", "3"]
    jf.plots.backend.pyplot().close(chart)


def test_two_callers_asking_for_one_point_leave_it_to_the_first(tmp_path):
    """Two machines on one study: a caller that asks for a point another live caller was
    given first gives it up (and next_point moves on); the table leaves that attempt out."""
    experiment = _experiment(tmp_path)
    first, second = open_search(experiment), open_search(experiment)
    trial, _ = first.ask(0)
    assert second.ask(0) is None and second.next_point() == 1
    first.tell(trial, COMPLETE, 60.0)
    table = frame(rows(second.study.get_trials(), ["depth"]), ["depth"], "maximize")
    assert table["trial"].tolist() == [trial.number] and table["attempts"].tolist() == [1]
