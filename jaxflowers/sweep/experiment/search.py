"""An experiment's trials in Optuna: the study in its storage, the points still to run,
ask and tell, pruning, and the trials a dead caller left RUNNING.

A grid or random search is a fixed list of points (point i of a random search depends only
on the seed and i); a Bayesian search asks TPE for each of its ``trials`` points. Every
trial records its point, its caller (host, pid) and a heartbeat, so a rerun finds which
points are finished (COMPLETE or PRUNED) and runs only the rest: a RUNNING trial is still
taken while its caller lives (on this host: its process; elsewhere: a heartbeat younger
than ``GRACE`` seconds), and is failed and rerun otherwise. Imported only by the functions
that run an experiment (it imports Optuna).
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from jaxflowers.host.processes import is_alive, start_time

__all__ = ["DefinitionError", "Search", "make_pruner"]

HEARTBEAT = 20.0  # seconds between the heartbeats of a caller's running trials
GRACE = 120.0  # a RUNNING trial of another host without a heartbeat for this long is lost
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


class DefinitionError(ValueError):
    """The storage holds an experiment of the same name defined otherwise."""


class _PointSampler(optuna.samplers.BaseSampler):
    """Gives each trial the values of its point (``trial.user_attrs["point"]``)."""

    def __init__(self, points: Sequence[Mapping[str, Any]]):
        self.points = list(points)

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, name, distribution):
        return self.points[trial.user_attrs["point"]][name]


def make_pruner(pruner) -> optuna.pruners.BasePruner:
    """An Optuna pruner from "none", "median" (``MedianPruner``), "halving"
    (``SuccessiveHalvingPruner``) or a pruner itself."""
    if isinstance(pruner, optuna.pruners.BasePruner):
        return pruner
    return {"none": optuna.pruners.NopPruner, "median": optuna.pruners.MedianPruner,
            "halving": optuna.pruners.SuccessiveHalvingPruner}[pruner]()


def _open_storage(storage: str, attempts: int = 3):
    """Optuna's storage at ``storage``. Two processes opening a new database at once (a rerun
    and a reader of its table, two callers) may both create its tables; the one that finds
    them made meanwhile opens it again."""
    import sqlalchemy.exc

    engine = {"connect_args": {"timeout": 60}} if storage.startswith("sqlite") else {}
    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(storage, engine_kwargs=engine)
        except sqlalchemy.exc.OperationalError as error:
            if "already exists" not in str(error) or attempt == attempts - 1:
                raise
            time.sleep(0.2)


class Search:
    """One experiment's study: its points, and ask / report / tell for its trials.

    Args:
      storage: an SQLAlchemy URL (``sqlite:///path.db``, ``postgresql://...``).
      shown: how messages name the storage (the URL without its password).
      name: the study's name in that storage.
      definition: what the experiment is (JSON-able); a study of the same name defined
        otherwise is refused.
      space: the parameters.
      points: the points of a grid or random search; None: TPE draws each.
      trials: how many points the experiment has.
      direction: "maximize" or "minimize".
      seed: TPE's seed.
      pruner: see ``make_pruner``.
    """

    def __init__(self, *, storage: str, shown: str, name: str, definition: Mapping,
                 space: Mapping, points: Sequence[Mapping] | None, trials: int,
                 direction: str, seed: int, pruner="none"):
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the experiment prints its own
        self.space, self.points, self.trials = dict(space), points, int(trials)
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(),
                      "started": start_time(os.getpid())}
        rdb = _open_storage(storage)
        self.study = optuna.create_study(storage=rdb, study_name=name, direction=direction,
                                         load_if_exists=True, pruner=make_pruner(pruner),
                                         sampler=_PointSampler(points or ()))
        _check_definition(self.study, dict(definition), name, shown)
        if points is None:  # TPE; a resumed study draws anew rather than repeat its start
            done = len(self.study.get_trials(deepcopy=False))
            self.study.sampler = optuna.samplers.TPESampler(
                seed=seed + done, n_startup_trials=min(10, max(2, self.trials // 3)))

    def recover(self) -> list[int]:
        """Fail the RUNNING trials whose caller is gone; returns their numbers."""
        lost = []
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if not self._taken(trial):
                try:
                    self.study.tell(trial.number, state=TrialState.FAIL)
                    lost.append(trial.number)
                except (ValueError, RuntimeError):  # another caller failed it first
                    pass
        return lost

    def next_point(self, mine: Sequence[int] = ()) -> int | None:
        """The first point neither finished nor taken by a live caller (``mine``: the points
        this caller runs now), or None when every point is."""
        taken = set(mine)
        for trial in self.study.get_trials(deepcopy=False):
            point = trial.user_attrs.get("point")
            if trial.state in FINISHED or (trial.state == TrialState.RUNNING
                                           and self._taken(trial)):
                taken.add(point)
        return next((p for p in range(self.trials) if p not in taken), None)

    def ask(self, point: int) -> tuple[optuna.Trial, dict] | None:
        """A new trial for ``point``; returns it and its parameter values, or None when
        another caller took the point at the same moment (the one asked first keeps it)."""
        trial = self.study.ask()
        trial.set_user_attr("point", point)
        trial.set_user_attr("owner", self.owner)
        trial.set_user_attr("heartbeat", time.time())
        rival = next((t.number for t in self.study.get_trials(deepcopy=False)
                      if t.user_attrs.get("point") == point and t.number < trial.number and
                      (t.state in FINISHED or (t.state == TrialState.RUNNING and
                                               self._taken(t)))), None)
        if rival is not None:
            trial.set_user_attr("duplicate_of", rival)  # left out of the results table
            self.study.tell(trial, state=TrialState.FAIL)
            return None
        return trial, {name: p.suggest(trial, name) for name, p in self.space.items()}

    def heartbeat(self, trials: Sequence[optuna.Trial]) -> None:
        """Say that this caller still runs ``trials``."""
        for trial in trials:
            trial.set_user_attr("heartbeat", time.time())

    def report(self, trial: optuna.Trial, value: float, step: int) -> bool:
        """Record an intermediate objective value; returns whether to prune the trial."""
        trial.report(value, step)
        return trial.should_prune()

    def tell(self, trial: optuna.Trial, state: TrialState, value: float | None = None,
             **attributes) -> None:
        """End ``trial`` in ``state`` (with its objective ``value`` when COMPLETE), after
        recording ``attributes`` as user attributes."""
        for key, item in attributes.items():
            trial.set_user_attr(key, item)
        self.study.tell(trial, value if state == TrialState.COMPLETE else None, state=state)

    def _taken(self, trial) -> bool:
        """Whether the caller of a RUNNING trial is still alive."""
        owner = trial.user_attrs.get("owner") or {}
        if owner.get("host") == self.owner["host"]:
            return is_alive(owner.get("pid", -1), owner.get("started"))
        return time.time() - float(trial.user_attrs.get("heartbeat", 0.0)) < GRACE


def _check_definition(study: optuna.Study, definition: dict, name: str, storage: str) -> None:
    """Record the experiment's definition in a new study; refuse an old one defined otherwise."""
    definition = json.loads(json.dumps(definition))  # as the storage gives it back
    stored = study.user_attrs.get("definition")
    if stored is None:
        study.set_user_attr("definition", definition)
        return
    differ = sorted(k for k in set(stored) | set(definition)
                    if stored.get(k) != definition.get(k))
    if differ:
        raise DefinitionError(
            f"experiment {name!r} in {storage} was defined with other {', '.join(differ)} "
            f"({', '.join(f'{k}={stored.get(k)!r}' for k in differ)}); give it another name "
            "or output folder, or repeat its definition to resume it")

