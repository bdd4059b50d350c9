"""jaxflowers: train image classifiers on every local GPU with JAX, Flax and Optax.

MATLAB's Deep Learning Toolbox names map to these (see the README's table):
``trainingOptions`` -> ``TrainingOptions``, ``trainnet`` -> ``train``,
``minibatchpredict`` -> ``predict``, ``scores2label`` -> ``scores_to_labels``,
``save``/``load`` of a network -> ``TrainedNet.save``/``load``.

Names load on first use (PEP 562), so ``import jaxflowers`` stays cheap and a sweep's
caller imports no JAX before its workers start.
"""
import sys
import types

from jaxflowers.lazy import lazy_names

_EXPORTS = {
    "TrainingOptions": "jaxflowers.options", "scale_for_devices": "jaxflowers.options",
    "ExecutionOptions": "jaxflowers.execution",
    "Labels": "jaxflowers.labels", "accuracy": "jaxflowers.labels",
    "classify": "jaxflowers.predict", "confusion_matrix": "jaxflowers.labels",
    "predict": "jaxflowers.predict", "scores_to_labels": "jaxflowers.labels",
    "TrainingInfo": "jaxflowers.info", "TrainedNet": "jaxflowers.net",
    "train": "jaxflowers.train", "enable_compilation_cache": "jaxflowers.compile_cache",
    "load": "jaxflowers.net",
}
_SUBMODULES = ("data", "models", "monitor", "plots", "recipes", "schedules", "sweep")
__all__ = sorted([*_EXPORTS, *_SUBMODULES])
__version__ = "0.1.0"


__getattr__, __dir__ = lazy_names(__name__, globals(), _EXPORTS, _SUBMODULES)


class _Package(types.ModuleType):
    """The package module, refusing one binding: the import system sets ``jaxflowers.train``
    (and ``.predict``) to the submodule when it is first imported, which would hide the
    function of the same name if that import happens before ``jf.train`` is first used."""

    def __setattr__(self, name, value):
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
