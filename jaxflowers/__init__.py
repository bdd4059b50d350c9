"""jaxflowers: train image classifiers on every local GPU with JAX, Flax and Optax.

MATLAB's ``trainingOptions``, ``trainnet``, ``minibatchpredict`` are ``TrainingOptions``,
``train``, ``predict``. Names load on first use, so ``import jaxflowers`` imports no JAX.
"""
import lazy_loader

__version__ = "0.1.0"
__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=["bench", "data", "distributed", "models", "monitor", "plots", "recipes",
                "schedules", "sweep"],
    submod_attrs={
        "options": ["ExecutionOptions", "TrainingOptions"],
        "parallel": ["scale_for_devices"],
        "training": ["StopReason", "TrainingInfo", "train"],
        "inference": ["Labels", "TrainedNet", "accuracy", "classify", "confusion_matrix",
                      "load", "predict", "scores_to_labels"],
        "compilation": ["enable_compilation_cache"],
    })
