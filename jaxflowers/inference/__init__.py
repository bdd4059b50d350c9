"""Using a trained network: ``TrainedNet``, ``predict``/``classify`` over every device, labels
and scores. ``labels`` and ``metrics`` import no JAX."""
from jaxflowers.host.lazy import lazy_names

_EXPORTS = {
    "TrainedNet": "jaxflowers.inference.net", "load": "jaxflowers.inference.net",
    "predict": "jaxflowers.inference.predict", "classify": "jaxflowers.inference.predict",
    "Labels": "jaxflowers.inference.labels", "accuracy": "jaxflowers.inference.labels",
    "confusion_matrix": "jaxflowers.inference.labels",
    "scores_to_labels": "jaxflowers.inference.labels",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_names(__name__, globals(), _EXPORTS)
