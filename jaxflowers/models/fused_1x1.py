"""1x1 convolutions that fold batch norm into the matrix product's loads and stores.

A bottleneck's 1x1 convolution is a product over M = N*H*W rows. Around it XLA runs passes
of their own: the batch norm before it applies its scale and ReLU (a read and a write of the
activation), and the batch norm after it reads the product's output once more for its sums.
The Pallas (Triton) kernel here applies the batch norm as it loads the input and takes the
output's sums as it stores it. The backward is the plain layers' (cuDNN's gradient kernels,
batch norm's closed form) and recomputes the apply where it needs it. On backends other than
GPUs the kernel runs in Pallas's interpreter: correct, slow, for tests.
"""
from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from jaxflowers.models.layers import param
from jaxflowers.models.norm import (
    F32,
    BatchNorm,
    affine,
    batch_norm_train,
    input_gradient,
    normalized,
    statistics,
)

__all__ = ["CONFIG", "BatchNormReLU1x1", "Kernel1x1", "bn_relu_1x1", "fits", "product",
           "tiles", "with_sums"]

# Tiles (rows, columns, step along K), warps and pipeline stages: the fastest on an H100 at
# most of ResNet-50's 1x1 shapes; ``tiles`` narrows them where K or N is 64.
CONFIG = (128, 128, 64, 4, 3)
_NARROW = {True: (64, 64, 64, 4, 4), False: (128, 64, 64, 4, 3)}  # by "N <= 64"
_MIN_TILE = 16  # Triton's smallest dot


def tiles(m: int, k: int, n: int):
    """The configuration ``(R, C, S, warps, stages)`` for ``(m, k) @ (k, n)``, its row tile
    the largest power of two up to R that divides ``m``; None if no tiling fits."""
    config = _NARROW[n <= 64] if min(k, n) <= 64 else CONFIG
    rows = config[0]
    while rows >= _MIN_TILE and m % rows:
        rows //= 2
    bn, bk = min(config[1], n), min(config[2], k)
    if rows < _MIN_TILE or min(bn, bk) < _MIN_TILE or n % bn or k % bk:
        return None
    return (rows, *config[1:])


def fits(m: int, k: int, n: int) -> bool:
    """Whether ``product`` can take an ``(m, k) @ (k, n)`` product."""
    return tiles(m, k, n) is not None


def _interpret() -> bool:
    return jax.default_backend() != "gpu"


def _dot(a, b):
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=F32)


def _applied(x, p_ref, cols):
    """``relu(bn(x))`` as float32 for a block ``x`` of the input's columns ``cols``, as
    ``norm.affine`` computes it; each of batch norm's rows (mean, scale/std, bias) loaded on
    its own, as Triton cannot slice a loaded block."""
    mean, mul, bias = (p_ref[i, cols] for i in range(3))
    return jnp.maximum((x.astype(F32) - mean) * mul + bias, 0.0)


def product(x, w, p=None, *, sums=True, config=None, interpret=None):
    """``x @ w`` for ``x`` (M, K) and ``w`` (K, N) of one dtype, in one kernel.

    Args:
      x, w: the input and the kernel; the output has their dtype.
      p: None, or (3, K) float32 rows of batch norm's mean, scale/std and bias:
        ``relu(bn(x)) @ w``, the apply done as ``x`` loads.
      sums: also return the (2, N) float32 sums of the output and its square over the rows
        (of the output as stored), taken per row block as it stores and added by XLA.
      config: ``(R, C, S, warps, stages)``; None: ``tiles(M, K, N)``.
      interpret: run in Pallas's interpreter; None: unless the backend is a GPU.

    Returns:
      The output (M, N), and with ``sums`` the (2, N) sums.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    (m, k), n = x.shape, w.shape[1]
    config = tiles(m, k, n) if config is None else config
    if config is None:
        raise ValueError(f"product: no tiling fits ({m}, {k}) @ ({k}, {n})")
    bm, bn, bk = min(config[0], m), min(config[1], n), min(config[2], k)
    grid = (m // bm, n // bn)

    def kernel(x_ref, w_ref, *refs):
        p_ref = refs[0] if p is not None else None
        o_ref, *sum_refs = refs[1:] if p is not None else refs

        def body(i, acc):
            cols = pl.ds(i * bk, bk)
            a = x_ref[:, cols]
            if p_ref is not None:
                a = _applied(a, p_ref, cols).astype(x.dtype)
            return acc + _dot(a, w_ref[cols, :])

        o = lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), F32)).astype(x.dtype)
        o_ref[...] = o
        if sum_refs:
            of = o.astype(F32)
            sum_refs[0][...] = of.sum(0)
            sum_refs[1][...] = (of * of).sum(0)

    in_specs = [pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                pl.BlockSpec((k, bn), lambda i, j: (0, j))]
    operands = [x, w]
    if p is not None:
        in_specs.append(pl.BlockSpec((3, k), lambda i, j: (0, 0)))
        operands.append(p)
    out_shape = [jax.ShapeDtypeStruct((m, n), x.dtype)]
    out_specs = [pl.BlockSpec((bm, bn), lambda i, j: (i, j))]
    if sums:
        out_shape += [jax.ShapeDtypeStruct((grid[0] * n,), F32)] * 2
        out_specs += [pl.BlockSpec((bn,), lambda i, j: (i * grid[1] + j,))] * 2
    outs = pl.pallas_call(
        kernel, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs,
        compiler_params=plgpu.CompilerParams(num_warps=config[3], num_stages=config[4]),
        interpret=_interpret() if interpret is None else interpret,
        name="bn_relu_1x1" if p is not None else "product_1x1")(*operands)
    if not sums:
        return outs[0]
    parts = [q.reshape(grid[0], n).sum(0) for q in outs[1:]]
    return outs[0], jnp.stack(parts)


def _rows(x):
    return x.reshape(-1, x.shape[-1])


@jax.custom_vjp
def with_sums(x, kernel):
    """``x @ kernel`` for ``x`` (B, H, W, K), a 1x1 convolution's float32 kernel (K, N) cast
    to ``x``'s dtype, and this device's (2, N) sums of the output and its square (no
    gradient). The caller checks ``fits`` first."""
    return _with_sums(x, kernel)[0]


def _with_sums(x, kernel):
    o, sums = product(_rows(x), kernel.astype(x.dtype))
    return (o.reshape(*x.shape[:-1], -1), sums), (x, kernel)


def _conv_backward(z, kernel, do):
    """The input and kernel gradients of the 1x1 convolution ``z @ kernel`` (NHWC, the
    kernel cast to ``z``'s dtype) from its output's gradient ``do``, as the plain layer's
    backward: cuDNN's gradient kernels, chosen by its autotuner."""
    w = kernel.astype(z.dtype).reshape(1, 1, *kernel.shape)
    _, backward = jax.vjp(lambda z, w: lax.conv_general_dilated(
        z, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")), z, w)
    dz, dw = backward(do.astype(z.dtype))
    return dz, dw.reshape(kernel.shape).astype(kernel.dtype)


def _with_sums_backward(residuals, cotangents):
    x, kernel = residuals
    return _conv_backward(x, kernel, cotangents[0])


with_sums.defvjp(_with_sums, _with_sums_backward)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def bn_relu_1x1(x, scale, bias, kernel, epsilon: float, axis_name):
    """``relu(batch_norm(x)) @ kernel`` in training, its statistics over ``x`` (B, H, W, K)
    pooled over ``axis_name`` (None: this device's): ``(o, sums, mean, var)``, ``sums`` the
    (2, N) sums of ``o`` and ``o**2`` on this device. Only ``o`` carries a gradient: to ``x``
    through batch norm's closed form, to ``scale``, ``bias`` and ``kernel``. The caller
    checks ``fits`` first."""
    return _bn_relu_1x1(x, scale, bias, kernel, epsilon, axis_name)[0]


def _bn_relu_1x1(x, scale, bias, kernel, epsilon, axis_name):
    scale, bias = scale.astype(F32), bias.astype(F32)
    mean, var = statistics(x, axis_name)
    rstd = lax.rsqrt(var + F32(epsilon))
    p = jnp.stack([mean, rstd * scale, bias])
    o, sums = product(_rows(x), kernel.astype(x.dtype), p)
    return ((o.reshape(*x.shape[:-1], -1), sums, mean, var),
            (x, mean, rstd, scale, bias, kernel))


def _bn_relu_1x1_backward(epsilon, axis_name, residuals, cotangents):
    del epsilon
    x, mean, rstd, scale, bias, kernel = residuals
    z = affine(x, mean, rstd * scale, bias, True, x.dtype)  # the forward's, recomputed
    dz, dw = _conv_backward(z, kernel, cotangents[0])
    xhat, above = normalized(x, mean, rstd, scale, bias)
    dy = jnp.where(above, dz.astype(F32), 0.0)
    dx, dscale, dbias = input_gradient(dy, xhat, rstd, scale, axis_name)
    return dx.astype(x.dtype), dscale, dbias, dw


bn_relu_1x1.defvjp(_bn_relu_1x1, _bn_relu_1x1_backward)


class Kernel1x1(nn.Module):
    """The kernel of a 1x1 convolution without bias, stored as ``layers.Conv`` stores it
    (``kernel`` (1, 1, K, N)): ``__call__(K)`` returns it as (K, N)."""

    features: int
    kernel_init: Callable = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, in_features: int):
        kernel = param(self, "kernel", self.kernel_init, (1, 1, in_features, self.features))
        return kernel.reshape(in_features, self.features)


class BatchNormReLU1x1(BatchNorm):
    """``BatchNorm(relu=True)`` (same variables) whose output only feeds a 1x1 convolution:
    ``__call__(x, kernel)`` returns that convolution's output and, in training, its (2, N)
    sums for the next ``BatchNorm(sums=...)`` (None otherwise). In training, where ``fits``,
    one kernel applies batch norm as it loads ``x`` and sums the output as it stores it."""

    relu: bool = True

    @nn.compact
    def __call__(self, x, kernel, use_running_average: bool | None = None):
        if not self.relu or self.channels is not None:
            raise ValueError("BatchNormReLU1x1 takes relu=True and the input's channels")
        scale, bias = self.parameters(x)
        x = jnp.asarray(x, self.dtype)
        frozen = self.frozen(use_running_average)
        if frozen or not fits(x.size // x.shape[-1], *kernel.shape):
            if frozen:
                mean, mul = self.running(x, scale)
                y = affine(x, mean, mul, bias.astype(F32), True, self.dtype)
            else:
                y, mean, var = batch_norm_train(x, scale, bias, None, self.epsilon,
                                                self.axis_name, True)
                self.update(mean, var)
            o = lax.dot_general(y, kernel.astype(self.dtype), (((x.ndim - 1,), (0,)), ((), ())),
                                preferred_element_type=F32).astype(self.dtype)
            return o, None
        o, sums, mean, var = bn_relu_1x1(x, scale, bias, kernel, self.epsilon, self.axis_name)
        self.update(mean, var)
        return o, sums
