"""``Experiment``: a training recipe and the parameters to vary (MATLAB's Experiment Manager).

The definition is checked whole when it is made: unknown parameters, values of the wrong
type, empty grids, distributions with low above high and objectives that no trial reports
are one-line errors naming the parameter, before any worker or database is touched.
``Experiment.run`` (``run.py``, ``session.py``) runs the trials; the results live in
Optuna's storage.
Imports neither JAX nor Optuna.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from typing import Any, Mapping

from jaxflowers import recipes
from jaxflowers.sweep.experiment import params as parameters
from jaxflowers.sweep.experiment.params import ParameterError
from jaxflowers.sweep.experiment.space import Design

__all__ = ["Experiment"]

STRATEGIES = ("grid", "random", "bayesian")
PRUNERS = ("none", "median", "halving")
DATABASE = "experiment.db"  # the default storage, in the output folder


@dataclasses.dataclass(frozen=True)
class Experiment:
    """An experiment: trials of one recipe over parameters, searched, pruned and kept.

    MATLAB: Experiment Manager's hyperparameter table, strategy (exhaustive sweep, random
    sampling, Bayesian optimisation) and results table.

    Args:
      recipe: the ``recipes.RECIPES`` name every trial starts from ("sweep", "digits"...).
      params: name -> a list of values or a distribution (``loguniform(1e-3, 1e-1)``,
        ``uniform``, ``integers``). A name is a ``TrainingOptions`` or ``ExecutionOptions``
        field, an argument of the network (``depth``, ``width``), ``model`` or ``data``;
        ``num_devices=N`` trains a trial data-parallel over N devices of one host.
      strategy: "grid" (every combination of the lists), "random" or "bayesian" (Optuna's
        TPE).
      trials: how many trials; a grid's default is every combination.
      objective: the validation value the search optimises: "validation_accuracy",
        "validation_loss" or "validation_<metric>" for the ``metrics`` option.
      direction: "maximize" or "minimize"; None: minimise losses, maximise the rest.
      data: the data set ("digits", "cifar10", a folder); None: the recipe's.
      model: the network's registry name; None: the recipe's.
      options: settings every trial shares (``{"max_epochs": 4}``).
      pruner: "none", "median", "halving" or an ``optuna.pruners`` pruner; it stops a
        trial whose validation values fall behind.
      seed: the data split's, the sampler's and (unless set) the trainings' seed.
      name: the experiment's name in its storage.
      out_dir: where the database, each trial's network and metrics, logs and figures go.
      storage: an SQLAlchemy URL (a shared server lets several machines run one
        experiment) or a file path; None: ``out_dir/experiment.db`` (SQLite).
      timeout: seconds a trial may run before it is killed and failed; None: no limit.

    Raises:
      ValueError: a bad definition, in one line naming the parameter or field.
    """

    recipe: str = "sweep"
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    strategy: str = "grid"
    trials: int | None = None
    objective: str = "validation_accuracy"
    direction: str | None = None
    data: str | None = None
    model: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    pruner: Any = "none"
    seed: int = 0
    name: str = "experiment"
    out_dir: str | os.PathLike = "experiment"
    storage: str | None = None
    timeout: float | None = None
    design: Design = dataclasses.field(init=False, repr=False, compare=False, default=None)
    points: list | None = dataclasses.field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self):
        if self.recipe not in recipes.RECIPES:
            raise ValueError(f"recipe={self.recipe!r} is not one of {', '.join(recipes.RECIPES)}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r}: use one of {', '.join(STRATEGIES)}")
        if not isinstance(self.pruner, str) and not hasattr(self.pruner, "prune"):
            raise ValueError(f"pruner={self.pruner!r}: use one of {', '.join(PRUNERS)} or an "
                             "optuna.pruners pruner")
        if isinstance(self.pruner, str) and self.pruner not in PRUNERS:
            raise ValueError(f"pruner={self.pruner!r}: use one of {', '.join(PRUNERS)}")
        if not self.params:
            raise ParameterError("an experiment needs at least one parameter to vary")
        _check_plain(self.options)
        space = {name: parameters.as_parameter(name, spec) for name, spec in self.params.items()}
        recipe = recipes.recipe(self.recipe)
        design = Design(self.recipe, self.data or recipe.data, self.model or recipe.model,
                        dict(self.options), space, int(self.seed))
        for name in (*space, *self.options):
            design.target(name)
        object.__setattr__(self, "design", design)
        object.__setattr__(self, "points", self._points(space))
        self._check_objective()
        self._check_values()

    # ------------------------------------------------------------------ definition

    @property
    def space(self) -> dict:
        """The parameters as ``params`` kinds (``Values``, ``Uniform``, ``Integers``)."""
        return dict(self.design.space)

    @property
    def num_trials(self) -> int:
        """How many trials the experiment has."""
        return len(self.points) if self.points is not None else int(self.trials)

    @property
    def goal(self) -> str:
        """"maximize" or "minimize" (``direction``, or the objective's natural one)."""
        if self.direction is not None:
            return self.direction
        return "minimize" if self.objective.endswith("loss") else "maximize"

    @property
    def storage_url(self) -> str:
        """Where the trials are kept, as an SQLAlchemy URL."""
        if self.storage is None:
            return f"sqlite:///{(pathlib.Path(self.out_dir) / DATABASE).resolve()}"
        text = os.fspath(self.storage)
        return text if "://" in text else f"sqlite:///{os.path.abspath(text)}"

    @property
    def storage_shown(self) -> str:
        """``storage_url`` with its password, if any, replaced by ``***`` (for logs)."""
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", self.storage_url)

    def definition(self) -> dict:
        """What makes this experiment itself (a rerun must match it): everything but the
        number of trials, the pruner, the timeout and where it runs."""
        return {"recipe": self.recipe, "data": self.design.data, "model": self.design.model,
                "params": parameters.describe(self.design.space), "options": dict(self.options),
                "strategy": self.strategy, "objective": self.objective,
                "direction": self.goal, "seed": int(self.seed)}

    # ------------------------------------------------------------------ running

    def run(self, pool=None, *, devices="all", jobs_per_device: int = 1,
            backend: str = "local", address: str | None = None, stream=None,
            live: bool = True, test: bool = True):
        """Run the trials not yet finished (all of them the first time), side by side.

        Args: those of ``run_experiment`` (``pool``, or ``devices``, ``jobs_per_device``,
          ``backend`` and ``address`` for a new one; ``stream``, ``live``, ``test``).

        Returns:
          An ``ExperimentResult``: the results table, the best trial, its test accuracy.
        """
        from jaxflowers.sweep.experiment.run import run_experiment

        return run_experiment(self, pool, devices=devices, jobs_per_device=jobs_per_device,
                              backend=backend, address=address, stream=stream, live=live,
                              test=test)

    def table(self):
        """The results table as the storage holds it now (a pandas ``DataFrame``, one row
        per trial, best first), without running anything."""
        from jaxflowers.sweep.experiment.session import open_search
        from jaxflowers.sweep.experiment.table import frame, rows

        search = open_search(self)
        names = list(self.design.space)
        return frame(rows(search.study.get_trials(deepcopy=False), names), names, self.goal)

    # ------------------------------------------------------------------ checks

    def _points(self, space) -> list[dict] | None:
        trials = self.trials
        if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int)
                                   or trials < 1):
            raise ValueError(f"trials={trials!r} must be a positive integer")
        if self.strategy == "grid":
            points = parameters.grid(space)
            return points[:trials] if trials is not None else points
        if trials is None:
            raise ValueError(f"strategy={self.strategy!r} needs trials=N, the number of trials")
        if self.strategy == "random":
            return parameters.random_points(space, trials, int(self.seed))
        return None

    def _check_objective(self) -> None:
        reported = self.design.reported()
        if self.objective not in reported:
            raise ValueError(f"objective={self.objective!r} is reported by no trial; the trials "
                             f"report {', '.join(reported)}")
        if self.direction not in (None, "maximize", "minimize"):
            raise ValueError(f"direction={self.direction!r}: use 'maximize', 'minimize' or None")

    def _check_values(self) -> None:
        """Every value of every parameter (alone), then every point of a grid or random
        search, as ``train`` would check them."""
        for name, parameter in self.design.space.items():
            for value in parameter.extremes():
                self.design.check({name: value}, f"parameter {name!r}")
        for index, point in enumerate(self.points or ()):
            self.design.check(point, f"trial {index} ({_settings(point)})")


def _check_plain(options: Mapping) -> None:
    """The fixed settings must travel as JSON (to the workers and into the study)."""
    for name, value in options.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ValueError(f"options[{name!r}]={value!r} is not JSON-able: give plain values "
                             "(an augmentation as a dict of Augmentation fields)") from None


def _settings(point: Mapping) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in point.items())
