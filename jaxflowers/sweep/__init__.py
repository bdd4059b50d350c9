"""Sweeps: many trainings side by side, one per GPU slot (MATLAB's parfeval workflow).

``DevicePool.submit`` is ``parfeval``, ``fetch_outputs`` ``fetchOutputs``, ``report`` and
``DevicePool.after_each`` a DataQueue's ``send`` and ``afterEach``; ``Experiment`` searches
parameters over such jobs (Experiment Manager). Imports no JAX.
"""
from jaxflowers.sweep.channel import report
from jaxflowers.sweep.experiment import (
    Experiment,
    ExperimentResult,
    integers,
    loguniform,
    uniform,
)
from jaxflowers.sweep.futures import JobError, JobFuture, JobTimeoutError, fetch_outputs
from jaxflowers.sweep.jobs import train_job
from jaxflowers.sweep.pool import DevicePool

__all__ = ["DevicePool", "Experiment", "ExperimentResult", "JobError", "JobFuture",
           "JobTimeoutError", "fetch_outputs", "integers", "loguniform", "report", "train_job",
           "uniform"]
