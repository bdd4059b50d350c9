"""What a run learns (``TrainingOptions``, MATLAB's ``trainingOptions``) and how it runs on
the hardware (``ExecutionOptions``). Imports no JAX."""
from jaxflowers.options.execution import ExecutionOptions, Resolved
from jaxflowers.options.training import TrainingOptions

__all__ = ["ExecutionOptions", "Resolved", "TrainingOptions"]
