"""Charts: MATLAB's ``confusionchart``, training progress, the sweep grid, speedup."""
from jaxflowers.plots.confusion import ConfusionChart, confusion_chart
from jaxflowers.plots.speedup import speedup, speedup_table
from jaxflowers.plots.sweep_grid import SweepProgressPlot, sweep_progress
from jaxflowers.plots.training_progress import TrainingProgressPlot, training_progress

__all__ = ["ConfusionChart", "SweepProgressPlot", "TrainingProgressPlot", "confusion_chart",
           "speedup", "speedup_table", "sweep_progress", "training_progress"]
