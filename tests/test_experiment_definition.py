"""jaxflowers.sweep.experiment's definition: parameters, their command-line form, where
each goes, and bad input refused in one line naming the parameter before anything runs.
No worker starts here."""
from __future__ import annotations

import subprocess
import sys

import pytest

import jaxflowers as jf
from jaxflowers.cli.entry import main
from jaxflowers.sweep import experiment as ex

SMALL = {"max_epochs": 1}


def _experiment(params, **kwargs):
    kwargs = {"recipe": "digits", "data": "digits", "options": SMALL, **kwargs}
    return jf.sweep.Experiment(params=params, **kwargs)


def test_command_line_parameters_parse_into_lists_and_distributions():
    assert ex.parse("depth=1,2,3,4") == ("depth", ex.Values((1, 2, 3, 4)))
    assert ex.parse("solver=sgdm,adam") == ("solver", ex.Values(("sgdm", "adam")))
    assert ex.parse("initial_learn_rate=loguniform:1e-3:1e-1") == (
        "initial_learn_rate", jf.sweep.loguniform(1e-3, 0.1))
    assert ex.parse("momentum=uniform:0.8:0.99") == ("momentum", jf.sweep.uniform(0.8, 0.99))
    assert ex.parse("width=logint:4:32") == ("width", jf.sweep.integers(4, 32, log=True))
    assert ex.parse("data=digits,/some/folder") == ("data", ex.Values(("digits", "/some/folder")))
    for item, message in [("depth", "use NAME="), ("depth=", "empty list"),
                          ("depth=int:1:2.5", "two int bounds"), ("lr=uniform:1", "two float")]:
        with pytest.raises(ex.ParameterError, match=message):
            ex.parse(item)


def test_a_grid_is_every_combination_the_last_parameter_fastest():
    experiment = _experiment({"depth": [1, 2], "seed": [0, 1, 2]})
    assert experiment.num_trials == 6 and experiment.points[:4] == [
        {"depth": 1, "seed": 0}, {"depth": 1, "seed": 1}, {"depth": 1, "seed": 2},
        {"depth": 2, "seed": 0}]
    assert _experiment({"depth": [1, 2], "seed": [0, 1, 2]}, trials=4).num_trials == 4


def test_random_points_depend_only_on_the_seed_and_their_number():
    """Point i of a random search is drawn from (seed, i) alone: the same seed draws the same
    trials, a longer search begins with the shorter one's, and a resumed search draws again
    exactly the points it had not finished."""
    params = {"depth": [1, 2, 3, 4], "initial_learn_rate": jf.sweep.loguniform(1e-4, 1e-1),
              "mini_batch_size": jf.sweep.integers(32, 256, log=True)}
    first = _experiment(params, strategy="random", trials=5, seed=7).points
    assert first == _experiment(params, strategy="random", trials=5, seed=7).points
    assert first[:3] == _experiment(params, strategy="random", trials=3, seed=7).points
    assert first != _experiment(params, strategy="random", trials=5, seed=8).points
    assert all(1e-4 <= p["initial_learn_rate"] <= 1e-1 and 32 <= p["mini_batch_size"] <= 256
               and p["depth"] in (1, 2, 3, 4) for p in first)


def test_each_parameter_goes_where_its_name_says():
    experiment = _experiment({"depth": [2], "width": [6], "initial_learn_rate": [0.01],
                              "num_devices": [2], "data": ["digits"]},
                             options={"max_epochs": 2, "steps_per_dispatch": 1})
    job = experiment.design.job(experiment.points[0], "/tmp/trial")
    assert job["model"] == ("cifar_net", {"depth": 2, "width": 6})
    assert job["options"] == {"seed": 0, "max_epochs": 2, "initial_learn_rate": 0.01}
    assert job["execution"] == {"steps_per_dispatch": 1, "num_devices": 2}
    assert job["data"]["source"] == "digits" and job["data"]["image_size"] == [32, 32]
    assert (job["recipe"], job["folder"]) == ("digits", "/tmp/trial")
    assert experiment.definition()["params"] == {
        "depth": "2", "width": "6", "initial_learn_rate": "0.01", "num_devices": "2",
        "data": "digits"}
    assert experiment.goal == "maximize"
    assert _experiment({"depth": [1]}, objective="validation_loss").goal == "minimize"


@pytest.mark.parametrize("params, kwargs, message", [
    ({"dept": [1, 2]}, {}, r"unknown parameter 'dept': not a TrainingOptions or "
                           r"ExecutionOptions field, nor an argument of cifar_net \(dense_init, "
                           r"depth, width\), nor data or model"),
    ({"depth": [1, "two"]}, {}, r"parameter 'depth': cifar_net's depth takes int values, "
                                r"not 'two'"),
    ({"mini_batch_size": [64, 1.5]}, {}, r"parameter 'mini_batch_size': .*mini_batch_size=1.5"),
    ({"solver": ["adam", "sgd"]}, {}, r"parameter 'solver': .*solver='sgd'"),
    ({"depth": []}, {}, r"parameter 'depth' has an empty list of values"),
    ({"initial_learn_rate": jf.sweep.loguniform(0.1, 1e-3)}, {"strategy": "random",
                                                              "trials": 2},
     r"parameter 'initial_learn_rate': loguniform low 0.1 is above high 0.001"),
    ({"initial_learn_rate": jf.sweep.loguniform(0, 1)}, {"strategy": "random", "trials": 2},
     r"parameter 'initial_learn_rate': loguniform needs positive bounds"),
    ({"initial_learn_rate": jf.sweep.uniform(1e-3, 1e-1)}, {},
     r"parameter 'initial_learn_rate' is a distribution .*a grid takes lists"),
    ({"depth": [1]}, {"objective": "validation_fscore"},
     r"objective='validation_fscore' is reported by no trial; the trials report "
     r"validation_accuracy, validation_loss$"),
    ({"depth": [1]}, {"strategy": "random"}, r"strategy='random' needs trials=N"),
    ({"depth": [1]}, {"strategy": "anneal"}, r"strategy='anneal': use one of grid, random"),
    ({"depth": [1]}, {"pruner": "hyperband"}, r"pruner='hyperband': use one of none, median"),
    ({"output_fn": [None]}, {}, r"parameter 'output_fn' cannot vary"),
    ({"num_devices": [3]}, {}, r"parameter 'num_devices': mini_batch_size=128 does not split "
                               r"evenly over num_devices=3"),
    ({"data": ["digits", "/no/such/folder"]}, {}, r"parameter 'data': data '/no/such/folder' "
                                                  r"is neither"),
    ({}, {}, r"needs at least one parameter"),
])
def test_bad_definitions_are_one_line_errors_naming_the_parameter(params, kwargs, message):
    with pytest.raises(ValueError, match=message) as caught:
        _experiment(params, **kwargs)
    assert "\n" not in str(caught.value)


def test_a_metric_option_makes_its_validation_value_an_objective():
    experiment = _experiment({"depth": [1]}, objective="validation_fscore",
                             options={"metrics": ["fscore"], "max_epochs": 1})
    assert experiment.design.reported()[-1] == "validation_fscore"


def test_the_cli_refuses_bad_parameters_in_one_line_before_any_worker(tmp_path, capsys):
    for argv, message in [
            (["--param", "dept=1,2"], "error: unknown parameter 'dept'"),
            (["--param", "initial_learn_rate=loguniform:1e-1:1e-3", "--strategy", "random",
              "--trials", "3"], "error: parameter 'initial_learn_rate': loguniform low 0.1 is "
                                "above high 0.001"),
            (["--param", "depth=1,2", "--objective", "accuracy"],
             "error: objective='accuracy' is reported by no trial"),
            (["--param", "depth=1,2", "--depths", "1", "2"], "error: --depths is the example's "
                                                             "shorthand")]:
        assert main(["sweep", *argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "experiment.db").exists() and not (tmp_path / "logs").exists()


def test_defining_an_experiment_imports_neither_jax_nor_optuna():
    code = ("import sys, jaxflowers as jf\n"
            "e = jf.sweep.Experiment(recipe='sweep', data='digits', strategy='random', trials=8,"
            " params={'depth': [1, 2, 3, 4], 'initial_learn_rate': jf.sweep.loguniform(1e-3, "
            "1e-1), 'l2_regularization': jf.sweep.loguniform(1e-10, 1e-2)})\n"
            "e.design.job(e.points[0], '.')\n"
            "print(sorted(m for m in ('jax', 'flax', 'optuna') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_storage_is_a_url_or_a_file_and_its_password_stays_out_of_messages(tmp_path):
    assert _experiment({"depth": [1]}, out_dir=tmp_path).storage_url == \
        f"sqlite:///{tmp_path.resolve()}/experiment.db"
    assert _experiment({"depth": [1]}, storage=str(tmp_path / "x.db")).storage_url == \
        f"sqlite:///{tmp_path}/x.db"
    shared = _experiment({"depth": [1]}, storage="postgresql://me:s3cret@db:5432/runs")
    assert shared.storage_shown == "postgresql://me:***@db:5432/runs"


def test_fixed_settings_must_be_plain_values():
    with pytest.raises(ValueError, match=r"options\['augmentation'\]=.* is not JSON-able"):
        _experiment({"depth": [1]}, options={"augmentation": jf.data.Augmentation()})
    _experiment({"depth": [1]}, options={"augmentation": {"reflect_x": True}})
    _experiment({"validation_patience": [2, 5]}, options={"output_network": "best-validation"})


def test_a_database_another_process_is_creating_is_opened_again(tmp_path, monkeypatch):
    """Two processes opening a new experiment database at once (a caller and a reader of its
    table) may both create its tables: the one that finds them made meanwhile opens it
    again; any other database error still stops it."""
    optuna = pytest.importorskip("optuna")
    import sqlalchemy.exc

    real, calls, errors = optuna.storages.RDBStorage, [], ["table studies already exists"]

    class Racing(real):
        def __init__(self, url, **kwargs):
            calls.append(url)
            if errors:
                real(url, **kwargs)  # the other process's tables, made meanwhile
                raise sqlalchemy.exc.OperationalError("CREATE TABLE studies", {},
                                                      Exception(errors.pop()))
            super().__init__(url, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", Racing)
    experiment = _experiment({"depth": [1, 2]}, out_dir=tmp_path)
    assert experiment.table().empty and len(calls) == 2
    errors.append("disk I/O error")
    with pytest.raises(sqlalchemy.exc.OperationalError, match="disk I/O error"):
        experiment.table()
