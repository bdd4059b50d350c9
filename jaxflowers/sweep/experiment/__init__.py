"""Experiments: a training recipe and parameters to vary, searched on a ``DevicePool``
(MATLAB's Experiment Manager; Optuna underneath).

``Experiment(recipe=..., params={...}, strategy="grid" | "random" | "bayesian", ...)``
defines one; ``run()`` runs the trials not yet finished and returns the results table;
the trials live in Optuna's storage, so a rerun resumes. Importing this package imports
neither JAX nor Optuna.
"""
from jaxflowers.sweep.experiment.experiment import PRUNERS, STRATEGIES, Experiment
from jaxflowers.sweep.experiment.params import (
    Integers,
    ParameterError,
    Uniform,
    Values,
    integers,
    loguniform,
    parse,
    uniform,
)
from jaxflowers.sweep.experiment.run import ExperimentResult, run_experiment

__all__ = ["Experiment", "ExperimentResult", "Integers", "PRUNERS", "ParameterError",
           "STRATEGIES", "Uniform", "Values", "integers", "loguniform", "parse",
           "run_experiment", "uniform"]
