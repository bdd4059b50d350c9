"""Charts: MATLAB's ``confusionchart``, training progress, the sweep grid, an experiment's
parameters against its objective, speedup."""
from jaxflowers.plots.confusion import ConfusionChart, confusion_chart
from jaxflowers.plots.experiment import parameter_chart
from jaxflowers.plots.speedup import speedup, speedup_table
from jaxflowers.plots.sweep_grid import SweepProgressPlot, sweep_progress
from jaxflowers.plots.training_progress import TrainingProgressPlot, training_progress

__all__ = ["ConfusionChart", "SweepProgressPlot", "TrainingProgressPlot", "confusion_chart",
           "parameter_chart", "speedup", "speedup_table", "sweep_progress", "training_progress"]
