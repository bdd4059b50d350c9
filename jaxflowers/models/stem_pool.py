"""ResNet's stem in training on GPUs: batch norm's apply, ReLU and the 3x3, stride-2 max pool
in one Pallas (Triton) kernel, so the 112 x 112 activation is never written.

XLA fuses the apply and ReLU into its pool fusion too, but that fusion loads one element at a
time (the padding's bounds checks). Here one kernel reads the convolution's output once and
writes the pooled output and each window's first-maximum offset; the backward is the max
pool's kernel and batch norm's closed form. The statistics are batch norm's own (XLA's
reductions), so the values, running statistics and gradients are those of
``BatchNorm(relu=True)`` followed by ``max_pool``: bit for bit in bfloat16 in the tests, to
float32's rounding of the apply in float32.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxflowers.models import maxpool, norm

__all__ = ["BatchNormReLUPool", "apply_and_pool", "bn_relu_pool", "used"]

F32 = jnp.float32
WINDOW, STRIDES, PADDING = (3, 3), (2, 2), ((1, 1), (1, 1))


def used(x, train: bool) -> bool:
    """Whether ResNet's stem normalises and pools ``x`` with ``BatchNormReLUPool``: in
    training, where the max pool's kernels run (GPUs) and take its shape."""
    return train and maxpool._on_gpu() and maxpool.kernel_takes(*x.shape[1:])


class BatchNormReLUPool(norm.BatchNorm):
    """``BatchNorm`` followed by the 3x3, stride-2 max pool with one row and column of
    padding: the same variables, values and gradients. In training one kernel
    (``bn_relu_pool``), which applies the ReLU, so there ``relu`` must be True."""

    def _stored(self, x, mean, mul, bias):
        return maxpool.max_pool(super()._stored(x, mean, mul, bias), WINDOW, STRIDES, PADDING)

    def _batch(self, x, scale, bias):
        if not self.relu:
            raise ValueError("BatchNormReLUPool: relu must be True")
        return bn_relu_pool(x, scale, bias, self.epsilon, self.axis_name)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def bn_relu_pool(x, scale, bias, epsilon: float, axis_name):
    """Training batch norm of ``x`` (N, H, W, C), ReLU, then a 3x3, stride-2 max pool with one
    row and column of padding: ``(pooled, mean, var)``; the statistics carry no gradient."""
    return _forward(x, scale, bias, epsilon, axis_name)[0]


def _forward(x, scale, bias, epsilon, axis_name):
    mean, var, rstd, scale, bias = norm._batch_statistics(x, scale, bias, epsilon, axis_name)
    pooled, first = apply_and_pool(x, mean, lax.mul(rstd, scale), bias)
    return (pooled, mean, var), (x, mean, rstd, scale, bias, first)


def _backward(epsilon, axis_name, residuals, cotangents):
    x, mean, rstd, scale, bias, first = residuals
    activation_grad = maxpool.kernel_backward(first, cotangents[0], x.dtype)
    return norm._backward(epsilon, axis_name, True, (x, mean, rstd, scale, bias),
                          (activation_grad,))


bn_relu_pool.defvjp(_forward, _backward)


def apply_and_pool(x, mean, mul, bias, *, num_warps: int = 4, interpret: bool | None = None):
    """``max_pool(relu(bn(x)))`` and its first-maximum offsets (as ``maxpool``'s forward
    records them) in one kernel, ``bn`` computed as ``norm``'s apply with per-channel
    float32 ``mean``, ``mul`` (scale / std) and ``bias``.

    Input columns are read as (even, odd) pairs: x viewed as (N, H, W/2, 2C). A program
    takes one output row; lane t of its tiles is output column t + 1, whose window columns
    are odd pair t, even pair t + 1 and odd pair t + 1, so every load starts at column 0 or
    1; output column 0 (its left column is padding) is computed from one-column tiles of the
    pairs at 0.

    Returns:
      (N, H/2, W/2, C) pooled values in ``x``'s dtype and int8 offsets.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    n, h, w, c = x.shape
    ho, wo = h // 2, w // 2
    width = pl.next_power_of_2(wo)
    pairs = x.reshape(n, h, wo, 2 * c)

    def kernel(x_ref, mean_ref, mul_ref, bias_ref, y_ref, first_ref):
        b, o = pl.program_id(0), pl.program_id(1)
        start = o * 0  # traced: Pallas refuses a static slice that runs past the array
        mean, mul, bias = (ref[...][None, :] for ref in (mean_ref, mul_ref, bias_ref))

        def applied(row, valid, shift, half, size=width):
            """relu(bn(x)) of input row ``row``'s ``size`` column pairs from ``shift``, even
            or odd half, as ``norm``'s apply rounds it; -inf where padding or past the edge."""
            mask = (jnp.arange(size)[:, None] + shift < wo) & valid
            v = plgpu.load(x_ref.at[b, row, pl.ds(start + shift, size), pl.ds(half * c, c)],
                           mask=mask, other=0)
            v = norm._applied(v.astype(F32), mean, mul, bias).astype(x.dtype)
            return jnp.where(mask, v, -jnp.inf)

        def store(values, shift, size, mask=None):
            """The maximum of ``values`` (one per window offset k = 3 di + dj) and the first
            k that holds it, stored from output column ``shift``."""
            top = values[0]
            for v in values[1:]:
                top = jnp.maximum(top, v)
            first = jnp.full(top.shape, len(values), jnp.int8)
            for k in reversed(range(len(values))):
                first = jnp.where(values[k] == top, jnp.int8(k), first)
            index = pl.ds(start + shift, size)
            plgpu.store(y_ref.at[b, o, index, :], top, mask=mask)
            plgpu.store(first_ref.at[b, o, index, :], first, mask=mask)

        rows = ((jnp.maximum(2 * o - 1, 0), o > 0), (2 * o, True), (2 * o + 1, True))
        main, edge = [], []
        for row, valid in rows:
            main += [applied(row, valid, 0, 1), applied(row, valid, 1, 0),
                     applied(row, valid, 1, 1)]
            edge += [jnp.full((1, c), -jnp.inf, x.dtype), applied(row, valid, 0, 0, 1),
                     applied(row, valid, 0, 1, 1)]
        store(main, 1, width, jnp.arange(width)[:, None] + 1 < wo)
        store(edge, 0, 1)

    return pl.pallas_call(
        kernel, grid=(n, ho),
        out_shape=(jax.ShapeDtypeStruct((n, ho, wo, c), x.dtype),
                   jax.ShapeDtypeStruct((n, ho, wo, c), jnp.int8)),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=maxpool.interpreted(interpret), name="bn_relu_max_pool")(pairs, mean, mul, bias)
