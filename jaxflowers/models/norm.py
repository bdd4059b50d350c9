"""Batch normalisation (optionally fused with the ReLU after it) with a hand-written backward.

Variables and statistics are ``flax.linen.BatchNorm``'s. The training gradient is the closed
form ``dx = scale * rstd / M * (M * dy - sum(dy) - xhat * sum(dy * xhat))`` (M samples per
channel) from the saved input, mean and 1/std: one two-output reduction, one elementwise pass.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from jaxflowers.models.layers import param

__all__ = ["BatchNorm", "F32", "batch_norm_train"]

F32 = jnp.float32


def _stats(x, axis_name):
    """Per-channel float32 mean and (biased) variance over every axis but the last."""
    axes = tuple(range(x.ndim - 1))
    xf = x.astype(F32)
    moments = jnp.stack([xf.mean(axes), jnp.square(xf).mean(axes)])
    if axis_name is not None:
        moments = lax.pmean(moments, axis_name)
    mean, mean2 = moments[0], moments[1]
    return mean, jnp.maximum(mean2 - jnp.square(mean), 0.0)


def _affine(x, mean, mul, bias, relu: bool, dtype):
    y = (x.astype(F32) - mean) * mul + bias
    return (jnp.maximum(y, 0.0) if relu else y).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def batch_norm_train(x, scale, bias, epsilon: float, axis_name, relu: bool):
    """Training-mode batch norm of ``x`` (..., C): ``(y, mean, var)``; stats carry no gradient."""
    return _normalize(x, scale, bias, epsilon, axis_name, relu)[0]


def _normalize(x, scale, bias, epsilon, axis_name, relu):
    mean, var = _stats(x, axis_name)
    rstd = lax.rsqrt(var + epsilon)
    y = _affine(x, mean, rstd * scale, bias, relu, x.dtype)
    return (y, mean, var), (x, mean, rstd, scale, bias)


def _backward(epsilon, axis_name, relu, residuals, cotangents):
    del epsilon
    x, mean, rstd, scale, bias = residuals
    dy = cotangents[0].astype(F32)
    xhat = (x.astype(F32) - mean) * rstd
    if relu:
        dy = jnp.where(xhat * scale + bias > 0, dy, 0.0)
    axes = tuple(range(x.ndim - 1))
    dbias, dscale = dy.sum(axes), (dy * xhat).sum(axes)
    count = x.size // x.shape[-1]
    sums = jnp.stack([dbias, dscale])
    if axis_name is not None:
        # The statistics pooled every device's samples, so every device's loss depends on
        # this device's inputs: the input gradient uses the global sums. The parameter
        # gradients stay local (the step averages them across devices).
        sums = lax.psum(sums, axis_name)
        count = count * lax.psum(1, axis_name)
    dx = (scale * rstd / count) * (count * dy - sums[0] - xhat * sums[1])
    return dx.astype(x.dtype), dscale, dbias


batch_norm_train.defvjp(_normalize, _backward)


class BatchNorm(nn.Module):
    """``flax.linen.BatchNorm`` over the last axis, optionally followed by a fused ReLU.

    Attributes:
      use_running_average: evaluate with the running statistics (inference).
      momentum, epsilon: decay of the running averages; added to the variance.
      dtype: compute/output dtype; statistics and parameters are float32.
      axis_name: mesh axis to pool statistics over (synchronised batch norm), or None.
      relu: apply ReLU to the output (fused into the same passes).
      scale_init, bias_init: initialisers of the (C,) parameters.
      channels: C, the channels stored, when the input has more (zero channels, see
        ``layers.Conv``): the extra channels get zero scale and bias, so they stay zero.
        None: the input's channels.

    As flax's, ``__call__(x, use_running_average=...)`` overrides the attribute (a frozen
    layer normalises with its stored statistics in training too).
    """

    use_running_average: bool = False
    momentum: float = 0.9
    epsilon: float = 1e-5
    dtype: Any = F32
    axis_name: str | None = None
    relu: bool = False
    scale_init: Callable = nn.initializers.ones
    bias_init: Callable = nn.initializers.zeros
    channels: int | None = None

    @nn.compact
    def __call__(self, x, use_running_average: bool | None = None):
        channels = x.shape[-1] if self.channels is None else self.channels
        extra = x.shape[-1] - channels

        def pad(value):  # zeros for the extra channels, which keep them zero
            return jnp.pad(value, (0, extra)) if extra else value

        ra_mean = self.variable("batch_stats", "mean", lambda: jnp.zeros((channels,), F32))
        ra_var = self.variable("batch_stats", "var", lambda: jnp.ones((channels,), F32))
        scale = pad(param(self, "scale", self.scale_init, (channels,)))
        bias = pad(param(self, "bias", self.bias_init, (channels,)))
        x = jnp.asarray(x, self.dtype)
        if self.use_running_average if use_running_average is None else use_running_average:
            mul = lax.rsqrt(pad(ra_var.value) + self.epsilon) * scale
            return _affine(x, pad(ra_mean.value), mul, bias, self.relu, self.dtype)
        y, mean, var = batch_norm_train(x, scale, bias, self.epsilon, self.axis_name, self.relu)
        if not self.is_initializing():
            m = self.momentum
            if extra:
                mean, var = mean[:channels], var[:channels]
            ra_mean.value = m * ra_mean.value + (1 - m) * lax.stop_gradient(mean)
            ra_var.value = m * ra_var.value + (1 - m) * lax.stop_gradient(var)
        return y
