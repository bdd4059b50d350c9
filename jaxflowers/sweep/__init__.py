"""Sweeps: many trainings side by side, one per GPU slot (MATLAB's parfeval workflow).

``DevicePool.submit`` (parfeval) returns ``concurrent.futures.Future``s; ``fetch_outputs``
(fetchOutputs) collects them; ``report`` inside a job and ``DevicePool.after_each``
(DataQueue + afterEach) carry progress; ``Future.cancel`` stops queued or running jobs.
``Experiment`` searches parameters over such jobs (``jaxflowers.sweep.experiment``).
Importing this package does not import JAX.
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
