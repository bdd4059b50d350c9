"""Using a trained network: ``TrainedNet``, ``predict``/``classify`` over every device, labels
and scores. ``labels`` and ``metrics`` import no JAX."""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "net": ["TrainedNet", "load"], "predict": ["classify", "predict"],
    "labels": ["Labels", "accuracy", "confusion_matrix", "scores_to_labels"]})
