"""jaxflowers: train image classifiers on every local GPU with JAX, Flax and Optax.

MATLAB names map to these (README): ``trainingOptions`` -> ``TrainingOptions``, ``trainnet``
-> ``train``, ``minibatchpredict`` -> ``predict``, ``scores2label`` -> ``scores_to_labels``.
Names load on first use, so ``import jaxflowers`` imports no JAX.
"""
from jaxflowers.host.lazy import lazy_names

_EXPORTS = {
    "TrainingOptions": "jaxflowers.options", "ExecutionOptions": "jaxflowers.options",
    "scale_for_devices": "jaxflowers.options",
    "train": "jaxflowers.training", "TrainingInfo": "jaxflowers.training",
    "StopReason": "jaxflowers.training",
    "TrainedNet": "jaxflowers.inference", "load": "jaxflowers.inference",
    "predict": "jaxflowers.inference", "classify": "jaxflowers.inference",
    "Labels": "jaxflowers.inference", "accuracy": "jaxflowers.inference",
    "confusion_matrix": "jaxflowers.inference", "scores_to_labels": "jaxflowers.inference",
    "enable_compilation_cache": "jaxflowers.compilation",
}
_SUBMODULES = ("bench", "data", "distributed", "models", "monitor", "plots", "recipes",
               "schedules", "sweep")
__all__ = sorted([*_EXPORTS, *_SUBMODULES])
__version__ = "0.1.0"

__getattr__, __dir__ = lazy_names(__name__, globals(), _EXPORTS, _SUBMODULES)
