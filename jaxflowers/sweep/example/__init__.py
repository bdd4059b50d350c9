"""MATLAB's parfeval example (``run_sweep``) and, for the notebook, its data plan and job."""
from jaxflowers.sweep.example.data import example_plan
from jaxflowers.sweep.example.run import SweepResult, depth_job, run_sweep

__all__ = ["SweepResult", "depth_job", "example_plan", "run_sweep"]
