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

__all__ = ["BatchNorm", "F32", "affine", "batch_norm_train", "input_gradient", "normalized",
           "statistics"]

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


def statistics(x, axis_name, sums=None):
    """Per-channel float32 mean and (biased) variance over every axis but the last, from
    ``sums`` (2, C) of ``x`` and ``x**2`` when a fused kernel already took them."""
    count = F32(x.size // x.shape[-1])
    if sums is None:
        axes = tuple(range(x.ndim - 1))
        xf = _f32(x)
        moments = _pair(lax.div(lax.reduce_sum(xf, axes), count),
                        lax.div(lax.reduce_sum(lax.square(xf), axes), count))
    else:
        moments = lax.div(sums, count)
    if axis_name is not None:
        moments = lax.pmean(moments, axis_name)
    mean = lax.index_in_dim(moments, 0, keepdims=False)
    mean2 = lax.index_in_dim(moments, 1, keepdims=False)
    return mean, lax.max(lax.sub(mean2, lax.square(mean)), F32(0))


def affine(x, mean, mul, bias, relu: bool, dtype):
    """``(x - mean) * mul + bias`` per channel, with a ReLU if ``relu``, as ``dtype``."""
    y = lax.add(lax.mul(lax.sub(_f32(x), _per_channel(mean, x)), _per_channel(mul, x)),
                _per_channel(bias, x))
    return lax.convert_element_type(lax.max(y, F32(0)) if relu else y, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def batch_norm_train(x, scale, bias, sums, epsilon: float, axis_name, relu: bool):
    """Training-mode batch norm of ``x`` (..., C): ``(y, mean, var)``; stats carry no gradient.
    ``sums``: None, or this device's (2, C) sums of ``x`` and ``x**2`` (no gradient)."""
    return _normalize(x, scale, bias, sums, epsilon, axis_name, relu)[0]


def _normalize(x, scale, bias, sums, epsilon, axis_name, relu):
    scale, bias = _f32(scale), _f32(bias)
    mean, var = statistics(x, axis_name, sums)
    rstd = lax.rsqrt(lax.add(var, F32(epsilon)))
    y = affine(x, mean, lax.mul(rstd, scale), bias, relu, x.dtype)
    return (y, mean, var), (x, mean, rstd, scale, bias, sums)


def normalized(x, mean, rstd, scale=None, bias=None):
    """float32 ``xhat = (x - mean) * rstd`` and, given ``scale`` and ``bias``, whether
    ``xhat * scale + bias`` is positive (where a ReLU after batch norm passes gradient)."""
    xhat = lax.mul(lax.sub(_f32(x), _per_channel(mean, x)), _per_channel(rstd, x))
    if scale is None:
        return xhat
    return xhat, lax.gt(lax.add(lax.mul(xhat, _per_channel(scale, x)), _per_channel(bias, x)),
                        F32(0))


def input_gradient(dy, xhat, rstd, scale, axis_name, sums=None):
    """Batch norm's closed-form backward from ``dy``, the float32 gradient of its output
    (after the ReLU's mask, if any): ``(dx, dscale, dbias)``, ``dx`` float32. ``sums``: this
    device's (2, C) sums of ``dy`` and ``dy * xhat``, when a fused kernel already took them."""
    axes = tuple(range(dy.ndim - 1))
    if sums is None:
        sums = _pair(lax.reduce_sum(dy, axes), lax.reduce_sum(lax.mul(dy, xhat), axes))
    dbias = lax.index_in_dim(sums, 0, keepdims=False)
    dscale = lax.index_in_dim(sums, 1, keepdims=False)
    count = dy.size // dy.shape[-1]
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
    inner = lax.sub(lax.sub(lax.mul(count, dy), _per_channel(sum_dy, dy)),
                    lax.mul(xhat, _per_channel(sum_dy_xhat, dy)))
    return lax.mul(_per_channel(coef, dy), inner), dscale, dbias


def _backward(epsilon, axis_name, relu, residuals, cotangents):
    del epsilon
    x, mean, rstd, scale, bias, sums = residuals
    dy = _f32(cotangents[0])
    if relu:
        xhat, above = normalized(x, mean, rstd, scale, bias)
        dy = lax.select(above, dy, lax.full_like(dy, 0))
    else:
        xhat = normalized(x, mean, rstd)
    dx, dscale, dbias = input_gradient(dy, xhat, rstd, scale, axis_name)
    no_sums = None if sums is None else jnp.zeros_like(sums)
    return lax.convert_element_type(dx, x.dtype), dscale, dbias, no_sums


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
    def __call__(self, x, use_running_average: bool | None = None, offset=None, sums=None):
        """Args: ``x`` (..., C); ``use_running_average`` and ``offset`` as above; ``sums``:
        this device's (2, C) float32 sums of ``x`` and ``x**2`` when a fused kernel took them
        (``models.fused_1x1``), which training then does not take again."""
        scale, bias = self.parameters(x)
        x = jnp.asarray(x, self.dtype)
        offset = None if offset is None else _f32(offset)
        if self.frozen(use_running_average):
            mean, mul = self.running(x, scale, offset)
            return affine(x, mean, mul, _f32(bias), self.relu, self.dtype)
        y, mean, var = batch_norm_train(x, scale, bias, sums, self.epsilon, self.axis_name,
                                        self.relu)
        self.update(mean, var, offset)
        return y

    def _extra(self, x) -> int:
        """Channels of ``x`` beyond those stored (see ``channels``)."""
        return 0 if self.channels is None else x.shape[-1] - self.channels

    def parameters(self, x):
        """Scale and bias, zero-padded to ``x``'s channels; declares the running averages."""
        channels, extra = x.shape[-1] - self._extra(x), self._extra(x)
        self.variable("batch_stats", "mean", lambda: jnp.zeros((channels,), F32))
        self.variable("batch_stats", "var", lambda: jnp.ones((channels,), F32))
        scale = param(self, "scale", self.scale_init, (channels,))
        bias = param(self, "bias", self.bias_init, (channels,))
        return _padded(scale, extra), _padded(bias, extra)

    def frozen(self, use_running_average) -> bool:
        """Whether to normalise with the running statistics (the call's choice, else the
        attribute's)."""
        return self.use_running_average if use_running_average is None else use_running_average

    def running(self, x, scale, offset=None):
        """The float32 mean and ``scale / std`` of the running statistics, padded to ``x``'s
        channels; ``scale`` as ``parameters`` returns it."""
        extra = self._extra(x)
        var = _padded(self.get_variable("batch_stats", "var"), extra)
        mul = lax.mul(lax.rsqrt(lax.add(var, F32(self.epsilon))), _f32(scale))
        mean = _padded(self.get_variable("batch_stats", "mean"), extra)
        return (mean if offset is None else lax.sub(mean, offset)), mul

    def update(self, mean, var, offset=None):
        """Decay the running averages toward a training batch's ``mean`` and ``var`` (over
        the computed channels); nothing while initialising."""
        if self.is_initializing():
            return
        if offset is not None:
            mean = lax.add(mean, offset)
        stored = self.get_variable("batch_stats", "mean").shape[0]
        if stored != mean.shape[0]:
            mean, var = mean[:stored], var[:stored]
        for name, value in (("mean", mean), ("var", var)):
            self.put_variable("batch_stats", name, _decayed(
                self.get_variable("batch_stats", name), value, self.momentum))


def _padded(value, extra: int):
    """``value`` (C,) with ``extra`` zeros after it: the extra channels stay zero."""
    return jnp.pad(value, (0, extra)) if extra else value


def _decayed(average, value, momentum: float):
    """``momentum * average + (1 - momentum) * value``; no gradient reaches ``value``."""
    return lax.add(lax.mul(F32(momentum), average),
                   lax.mul(F32(1 - momentum), lax.stop_gradient(value)))
