"""Validation scores over the whole set's logits, on the host, in MATLAB's units (accuracy
in percent; F-score, precision, recall and AUC as macro-averaged fractions).
"""
from __future__ import annotations

import numpy as np

from jaxflowers.inference.labels import log_softmax

__all__ = ["MAXIMISED", "score"]

# Whether a larger value is better, per objective.
MAXIMISED = {"loss": False, "accuracy": True, "fscore": True, "precision": True,
             "recall": True, "auc": True}


def score(logits: np.ndarray, labels: np.ndarray, names=()) -> dict[str, float]:
    """Cross-entropy ``"loss"``, ``"accuracy"`` (%) and each metric in ``names``, as floats.

    Args:
      logits: float (n, C). labels: int (n,). names: among "fscore", "precision", "recall", "auc".

    Returns:
      ``{"loss": ..., "accuracy": ..., name: ...}``; all NaN if a logit is not finite.
    """
    names = [name for name in names if name != "accuracy"]
    if not np.isfinite(logits).all():
        return dict.fromkeys(("loss", "accuracy", *names), float("nan"))
    log_probs = log_softmax(logits)
    labels = np.asarray(labels, np.int64)
    predicted = np.argmax(log_probs, axis=1)
    scores = {"loss": float(-np.mean(log_probs[np.arange(len(labels)), labels])),
              "accuracy": 100.0 * float(np.mean(predicted == labels))}
    for name in names:
        scores[name] = _metric(name, labels, predicted, np.exp(log_probs))
    return scores


def _metric(name: str, labels, predicted, probabilities) -> float:
    from sklearn import metrics  # scikit-learn loads only when a metric is asked for

    if name == "auc":
        return _macro_auc(labels, probabilities)
    fn = {"fscore": metrics.f1_score, "precision": metrics.precision_score,
          "recall": metrics.recall_score}[name]
    return float(fn(labels, predicted, average="macro", zero_division=0))


def _macro_auc(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean one-vs-rest ROC AUC over the classes that have an AUC; NaN when none has."""
    from sklearn.metrics import roc_auc_score

    areas = [roc_auc_score(labels == c, probabilities[:, c]) for c in np.unique(labels)
             if 0 < np.sum(labels == c) < len(labels)]
    return float(np.mean(areas)) if areas else float("nan")
