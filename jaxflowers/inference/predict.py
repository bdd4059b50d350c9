"""``predict`` (MATLAB's ``minibatchpredict``) and ``classify``, split over every device."""
from __future__ import annotations

import warnings

import numpy as np

from jaxflowers.inference.forward import ForwardPass
from jaxflowers.inference.labels import Labels, log_softmax, scores_to_labels
from jaxflowers.parallel.data_parallel import DataParallel, select_devices

__all__ = ["classify", "predict"]


def predict(net, data, *, mini_batch_size: int = 128, execution_environment: str = "auto",
            num_devices: int | None = None, strategy: str = "shard_map") -> np.ndarray:
    """Class scores for every image, split over the devices (MATLAB's ``minibatchpredict``).

    Args:
      net: a ``TrainedNet``. data: an image set or uint8 (n, H, W, C).
      mini_batch_size: images per device per pass. execution_environment, num_devices,
        strategy: as in the options.

    Returns:
      float32 (n, num_classes) softmax scores; with several processes, all on every process.
    """
    if not hasattr(net, "class_names"):
        raise TypeError(f"predict takes a TrainedNet, not a {type(net).__name__}; a "
                        "pretrained network becomes one by training it, or with its file's "
                        "head through TrainedNet.from_pretrained")
    images = np.asarray(getattr(data, "images", data))
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"predict needs uint8 images (n, H, W, C); got {images.dtype} "
                         f"{images.shape}")
    if images.shape[1:] != tuple(net.input_shape):
        raise ValueError(f"predict: images are {images.shape[1:]} but the network was trained "
                         f"on {tuple(net.input_shape)}")
    if len(images) == 0:  # nothing to split over the devices; no program to compile
        return np.zeros((0, len(net.class_names)), np.float32)
    parallel = DataParallel(select_devices(execution_environment, num_devices), strategy)
    # Right after ``train`` (same devices, batch, image count) this is its compiled validation.
    forward = ForwardPass(parallel, net.model, net.dtype, mini_batch_size)
    variables = parallel.put(net.variables)
    stats = parallel.put(tuple(np.asarray(s, np.float32) for s in net.normalization))
    logits = forward.logits(variables, forward.place(images), stats)
    # why on the host: an eager softmax on the devices would compile small programs each run.
    scores = np.exp(log_softmax(logits)).astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(scores).all(axis=1))
    if bad.size:
        warnings.warn(f"predict: the scores of {bad.size} of {len(scores)} images are not "
                      f"finite (first: row {bad[0]}); the network's outputs overflow "
                      "(a diverged network?), and scores_to_labels will refuse them",
                      RuntimeWarning, stacklevel=2)
    return scores


def classify(net, data, **kwargs) -> tuple[Labels, np.ndarray]:
    """Predicted labels and scores (``classify``); keyword arguments as ``predict``."""
    scores = predict(net, data, **kwargs)
    return scores_to_labels(scores, net.class_names), scores
