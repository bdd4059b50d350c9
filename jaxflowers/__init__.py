"""jaxflowers: train image classifiers on every local GPU with JAX, Flax and Optax.

MATLAB's Deep Learning Toolbox names map to these (see the README's table):
``trainingOptions`` -> ``TrainingOptions``, ``trainnet`` -> ``train``,
``minibatchpredict`` -> ``predict``, ``scores2label`` -> ``scores_to_labels``.
"""
from jaxflowers import data, models
from jaxflowers.options import TrainingOptions, scale_for_devices
from jaxflowers.predict import (Labels, accuracy, classify, confusion_matrix, predict,
                                scores_to_labels)
from jaxflowers.progress import TrainingInfo
from jaxflowers.train import TrainedNet, train

__all__ = ["Labels", "TrainedNet", "TrainingInfo", "TrainingOptions", "accuracy", "classify",
           "confusion_matrix", "data", "models", "predict", "scale_for_devices",
           "scores_to_labels", "train"]
__version__ = "0.1.0"
