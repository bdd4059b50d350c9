"""Population batch-norm statistics (MATLAB's ``BatchNormalizationStatistics="population"``).

During training each batch-norm layer keeps running (moving) averages of its mini-batch
statistics, weighted towards the last iterations. "population" replaces them, after
training, by statistics of one pass over the training data with the final weights. The
pass is defined exactly as follows:

* It takes the training set in its stored order, in whole global mini-batches of
  ``mini_batch_size`` (the last partial one left out, as a training epoch does), without
  random augmentation (a ``random_crop`` becomes the centred crop of that size).
* The network runs in training mode, as MATLAB's pass does: every batch-norm layer
  normalises with the statistics of the current mini-batch, pooled over the whole global
  batch on every device (synchronised batch norm, for models with a ``bn_axis_name``), so
  the pass computes what one device given the whole mini-batch would.
* Each layer's mean is the mean of its inputs over every sample and position of the pass,
  its variance the (biased) mean of squares minus the squared mean, both from the float32
  inputs the layer normalises: the exact population moments of what the layer saw, not an
  average of per-batch variances.

These functions are per device; ``program.TrainProgram`` wraps and compiles them.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
from flax import traverse_util
from jax import lax

from jaxflowers.data.augment import normalize
from jaxflowers.models.norm import BatchNorm
from jaxflowers.parallel import AXIS


def zero_moments(batch_stats) -> dict:
    """Zeroed sums, float32 (2, C), for each batch-norm layer (path -> sums) of the tree."""
    flat = traverse_util.flatten_dict(batch_stats)
    return {path[:-1]: jnp.zeros((2, *value.shape), jnp.float32)
            for path, value in flat.items() if path[-1] == "mean"}


def batch_moments(variables, images, stats, *, model, dtype, crop) -> dict:
    """Per batch-norm layer, the mean and the mean of squares of its float32 inputs per
    channel over this global mini-batch, (2, C), from this device's (b, H, W, C) uint8 rows.
    """
    x = normalize(_centre_crop(images, crop), stats[0], stats[1], dtype)
    found = {}

    def record(next_fun, args, kwargs, context):
        module = context.module
        if context.method_name == "__call__" and isinstance(module, (BatchNorm, nn.BatchNorm)):
            # What the layer normalises: its input in its compute dtype, as float32.
            inputs = jnp.asarray(args[0], getattr(module, "dtype", None)).astype(jnp.float32)
            axes = tuple(range(inputs.ndim - 1))
            moments = jnp.stack([inputs.mean(axes), jnp.square(inputs).mean(axes)])
            # Equal rows per device: the mean of the devices' means is the batch's mean.
            found[module.scope.path] = lax.pmean(moments, AXIS)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        model.apply(variables, x, train=True, mutable=["batch_stats"])
    return found


def resident_pass(variables, images, order, stats, *, model, dtype, crop) -> dict:
    """``variables`` with population statistics from the resident training set.

    Args:
      variables: {"params", "batch_stats"} in tree form, replicated.
      images: (N, H, W, C) uint8, the whole training set on this device.
      order: (batches, b) int32, this device's columns of each global mini-batch.
      stats: per-channel input (mean, std), float32 (C,) each.
    """
    def add(total, rows):
        moments = batch_moments(variables, jnp.take(images, rows, axis=0), stats,
                                model=model, dtype=dtype, crop=crop)
        return accumulate(total, moments), None

    total, _ = lax.scan(add, zero_moments(variables["batch_stats"]), order)
    return with_population(variables, total, order.shape[0])


def accumulate(total: dict, moments: dict) -> dict:
    """``total + moments``, layer by layer (every layer of ``total`` must be present)."""
    missing = total.keys() - moments.keys()
    if missing:
        raise ValueError(f"batch-norm layers {sorted(missing)} saw no input in the pass "
                         "(each must be applied once per forward pass)")
    return {path: total[path] + moments[path] for path in total}


def with_population(variables: dict, total: dict, batches: int) -> dict:
    """``variables`` with each layer's mean and variance from ``total``, the sums of
    ``batches`` equal-sized batches' moments."""
    flat = traverse_util.flatten_dict(variables["batch_stats"])
    for path, sums in total.items():
        mean, mean_square = sums[0] / batches, sums[1] / batches
        flat[path + ("mean",)] = mean
        flat[path + ("var",)] = jnp.maximum(mean_square - jnp.square(mean), 0.0)
    return {**variables, "batch_stats": traverse_util.unflatten_dict(flat)}


def _centre_crop(images, crop):
    """The centred ``crop`` (height, width) of (b, H, W, C) images; None: unchanged."""
    if crop is None:
        return images
    top, left = (images.shape[1] - crop[0]) // 2, (images.shape[2] - crop[1]) // 2
    return images[:, top:top + crop[0], left:left + crop[1]]
