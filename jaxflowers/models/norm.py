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


def _f32(x):
    return lax.convert_element_type(x, F32)


def _per_channel(v, x):
    """A (C,) vector laid along the last axis of ``x`` (..., C)."""
    return lax.broadcast_in_dim(v, x.shape, (x.ndim - 1,))


def _pair(a, b):
    """``jnp.stack([a, b])`` of two (C,) vectors."""
    return lax.concatenate([lax.expand_dims(a, (0,)), lax.expand_dims(b, (0,))], 0)


# The functions below are written in lax, not jnp: each jnp operator on a tracer is a small
# jit of its own, and a ResNet-50 block traces over 2,000 of them here (same primitives).


def _stats(x, axis_name):
    """Per-channel float32 mean and (biased) variance over every axis but the last."""
    axes = tuple(range(x.ndim - 1))
    xf = _f32(x)
    count = F32(x.size // x.shape[-1])
    moments = _pair(lax.div(lax.reduce_sum(xf, axes), count),
                    lax.div(lax.reduce_sum(lax.square(xf), axes), count))
    if axis_name is not None:
        moments = lax.pmean(moments, axis_name)
    mean = lax.index_in_dim(moments, 0, keepdims=False)
    mean2 = lax.index_in_dim(moments, 1, keepdims=False)
    return mean, lax.max(lax.sub(mean2, lax.square(mean)), F32(0))


def _affine(x, mean, mul, bias, relu: bool, dtype):
    per_channel = (_per_channel(v, x) for v in (mean, mul, bias))
    return lax.convert_element_type(_applied(_f32(x), *per_channel, relu), dtype)


def _applied(xf, mean, mul, bias, relu: bool = True):
    """Float32 ``(x - mean) * mul + bias`` of ``xf``, ReLU'd if ``relu``; per-channel values
    broadcast against ``xf`` (the stem's pool kernel rounds exactly as the layers)."""
    y = lax.add(lax.mul(lax.sub(xf, mean), mul), bias)
    return lax.max(y, F32(0)) if relu else y


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def batch_norm_train(x, scale, bias, epsilon: float, axis_name, relu: bool):
    """Training-mode batch norm of ``x`` (..., C): ``(y, mean, var)``; stats carry no gradient."""
    return _normalize(x, scale, bias, epsilon, axis_name, relu)[0]


def _batch_statistics(x, scale, bias, epsilon, axis_name):
    """``(mean, var, rstd, scale, bias)`` of a training forward: the batch's statistics,
    1/std, and the parameters in float32, as the backward's residuals take them."""
    mean, var = _stats(x, axis_name)
    return mean, var, lax.rsqrt(lax.add(var, F32(epsilon))), _f32(scale), _f32(bias)


def _normalize(x, scale, bias, epsilon, axis_name, relu):
    mean, var, rstd, scale, bias = _batch_statistics(x, scale, bias, epsilon, axis_name)
    y = _affine(x, mean, lax.mul(rstd, scale), bias, relu, x.dtype)
    return (y, mean, var), (x, mean, rstd, scale, bias)


def _backward(epsilon, axis_name, relu, residuals, cotangents):
    del epsilon
    x, mean, rstd, scale, bias = residuals
    dy = _f32(cotangents[0])
    xhat = lax.mul(lax.sub(_f32(x), _per_channel(mean, x)), _per_channel(rstd, x))
    if relu:
        above = lax.gt(lax.add(lax.mul(xhat, _per_channel(scale, x)), _per_channel(bias, x)),
                       F32(0))
        dy = lax.select(above, dy, lax.full_like(dy, 0))
    axes = tuple(range(x.ndim - 1))
    dbias, dscale = lax.reduce_sum(dy, axes), lax.reduce_sum(lax.mul(dy, xhat), axes)
    count = x.size // x.shape[-1]
    sums = _pair(dbias, dscale)
    if axis_name is not None:
        # The statistics pooled every device's samples, so every device's loss depends on
        # this device's inputs: the input gradient uses the global sums. The parameter
        # gradients stay local (the step averages them across devices).
        sums = lax.psum(sums, axis_name)
        count = count * lax.psum(1, axis_name)
    count = _f32(count)
    coef = lax.div(lax.mul(scale, rstd), count)
    sum_dy = lax.index_in_dim(sums, 0, keepdims=False)
    sum_dy_xhat = lax.index_in_dim(sums, 1, keepdims=False)
    inner = lax.sub(lax.sub(lax.mul(count, dy), _per_channel(sum_dy, x)),
                    lax.mul(xhat, _per_channel(sum_dy_xhat, x)))
    dx = lax.mul(_per_channel(coef, x), inner)
    return lax.convert_element_type(dx, x.dtype), dscale, dbias


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
    layer normalises with its stored statistics in training too). ``__call__(x, offset=b)``
    normalises ``x + b`` for a per-channel ``b`` (C,) without adding it: batch statistics
    cancel it, so only the running mean and the stored statistics see it. A convolution's bias
    folded this way costs neither a pass nor a gradient reduction in training, where its
    gradient is zero.
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
    def __call__(self, x, use_running_average: bool | None = None, offset=None):
        channels = x.shape[-1] if self.channels is None else self.channels
        extra = x.shape[-1] - channels

        def pad(value):  # zeros for the extra channels, which keep them zero
            return jnp.pad(value, (0, extra)) if extra else value

        ra_mean = self.variable("batch_stats", "mean", lambda: jnp.zeros((channels,), F32))
        ra_var = self.variable("batch_stats", "var", lambda: jnp.ones((channels,), F32))
        scale = pad(param(self, "scale", self.scale_init, (channels,)))
        bias = pad(param(self, "bias", self.bias_init, (channels,)))
        x = jnp.asarray(x, self.dtype)
        offset = None if offset is None else _f32(offset)
        if self.use_running_average if use_running_average is None else use_running_average:
            mul = lax.mul(lax.rsqrt(lax.add(pad(ra_var.value), F32(self.epsilon))), _f32(scale))
            mean = pad(ra_mean.value)
            if offset is not None:
                mean = lax.sub(mean, offset)
            return self._stored(x, mean, mul, _f32(bias))
        y, mean, var = self._batch(x, scale, bias)
        if not self.is_initializing():
            m = self.momentum
            if offset is not None:
                mean = lax.add(mean, offset)
            if extra:
                mean, var = mean[:channels], var[:channels]
            ra_mean.value = _decayed(ra_mean.value, mean, m)
            ra_var.value = _decayed(ra_var.value, var, m)
        return y

    def _stored(self, x, mean, mul, bias):
        """The output normalised with the stored statistics (``mul``: scale / std)."""
        return _affine(x, mean, mul, bias, self.relu, self.dtype)

    def _batch(self, x, scale, bias):
        """The output normalised with the batch's statistics, and the statistics."""
        return batch_norm_train(x, scale, bias, self.epsilon, self.axis_name, self.relu)


def _decayed(average, value, momentum: float):
    """``momentum * average + (1 - momentum) * value``; no gradient reaches ``value``."""
    return lax.add(lax.mul(F32(momentum), average),
                   lax.mul(F32(1 - momentum), lax.stop_gradient(value)))
