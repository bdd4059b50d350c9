"""MATLAB's parfeval example end to end (``run_sweep``), and its parts for the notebook:
the data plan the jobs share, the job, and the example's three sets."""
from jaxflowers.sweep.example.data import data_plan, load_sets, prepare_data
from jaxflowers.sweep.example.run import SweepResult, depth_job, run_sweep

__all__ = ["SweepResult", "data_plan", "depth_job", "load_sets", "prepare_data", "run_sweep"]
