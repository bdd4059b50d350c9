"""MATLAB's parfeval example end to end (``run_sweep``), and its parts for the notebook:
the data plan the jobs share and the job."""
from jaxflowers.sweep.example.data import example_plan
from jaxflowers.sweep.example.run import SweepResult, depth_job, run_sweep

__all__ = ["SweepResult", "depth_job", "example_plan", "run_sweep"]
