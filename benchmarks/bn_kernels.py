"""Batch norm's per-channel sums over (..., C) activations as Pallas (Triton) GPU kernels,
for ``bn_reductions.py``: each program reads one block of rows and leaves one partial row,
summed after. Where the kernels do not apply (channels not a power of two, too few rows)
the same sums come from ``jnp``; ``impl="interpret"`` runs the kernels on a CPU.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = ["grad_sums", "moments"]

F32 = jnp.float32
_TILE = 16384  # elements of a program's row block


def _rows(x):
    return x.reshape(-1, x.shape[-1])


def _block_rows(m: int, c: int, tile: int) -> int | None:
    """Rows per program: a power of two dividing ``m`` with about ``tile`` elements, or None
    where the kernel does not apply (channels not a power of two, or too few rows)."""
    if c < 16 or c & (c - 1) or c > tile:
        return None
    rows = tile // c
    while rows > 1 and m % rows:
        rows //= 2
    return rows if rows >= 8 and m // rows >= 2 else None


def moments(x, *, impl: str = "auto", tile: int = _TILE, warps: int = 4):
    """``(2, C)`` float32: the sums of ``x`` and of ``x**2`` over every axis but the last."""
    rows = _block_rows(x.size // x.shape[-1], x.shape[-1], tile)
    if impl == "xla" or rows is None:
        return _moments_xla(x)
    if impl == "auto":
        return jax.lax.platform_dependent(
            x, cuda=functools.partial(_moments_kernel, rows=rows, warps=warps,
                                      interpret=False),
            default=_moments_xla)
    return _moments_kernel(x, rows=rows, warps=warps, interpret=impl == "interpret")


def grad_sums(dy, x, mean, rstd, scale, bias, relu: bool, *, impl: str = "auto",
              tile: int = _TILE, warps: int = 4):
    """``(2, C)`` float32: the sums of ``g`` and of ``g * xhat`` over every axis but the last,
    where ``xhat = (x - mean) * rstd`` and ``g`` is ``dy``, zero where ``relu`` masked it
    (``xhat * scale + bias <= 0``)."""
    rows = _block_rows(x.size // x.shape[-1], x.shape[-1], tile)
    params = jnp.stack([mean, rstd, scale, bias]).astype(F32)
    if impl == "xla" or rows is None:
        return _grad_sums_xla(dy, x, params, relu)
    kernel = functools.partial(_grad_sums_kernel, relu=relu, rows=rows, warps=warps)
    if impl == "auto":
        return jax.lax.platform_dependent(
            dy, x, params, cuda=functools.partial(kernel, interpret=False),
            default=functools.partial(_grad_sums_xla, relu=relu))
    return kernel(dy, x, params, interpret=impl == "interpret")


# ---------------------------------------------------------------- jnp


def _moments_xla(x):
    axes = tuple(range(x.ndim - 1))
    xf = x.astype(F32)
    return jnp.stack([xf.sum(axes), jnp.square(xf).sum(axes)])


def _masked(dy, x, params, relu):
    xhat = (x.astype(F32) - params[0]) * params[1]
    g = dy.astype(F32)
    if relu:
        g = jnp.where(xhat * params[2] + params[3] > 0, g, 0.0)
    return g, xhat


def _grad_sums_xla(dy, x, params, relu):
    g, xhat = _masked(dy, x, params, relu)
    axes = tuple(range(x.ndim - 1))
    return jnp.stack([g.sum(axes), (g * xhat).sum(axes)])


# ---------------------------------------------------------------- Pallas


def _call(kernel, inputs, specs, c, rows, m, warps, interpret):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    programs = m // rows
    out = jax.ShapeDtypeStruct((programs * c,), F32)
    spec = pl.BlockSpec((c,), lambda i: (i,))
    first, second = pl.pallas_call(
        kernel, out_shape=(out, out), grid=(programs,), in_specs=specs,
        out_specs=(spec, spec), interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=1),
        name="channel_sums")(*inputs)
    return jnp.stack([first.reshape(programs, c).sum(0), second.reshape(programs, c).sum(0)])


def _moments_kernel(x, *, rows, warps, interpret):
    from jax.experimental import pallas as pl

    def kernel(x_ref, s_ref, q_ref):
        v = x_ref[...].astype(F32)
        s_ref[...] = v.sum(0)
        q_ref[...] = (v * v).sum(0)

    flat = _rows(x)
    m, c = flat.shape
    specs = [pl.BlockSpec((rows, c), lambda i: (i, 0))]
    return _call(kernel, [flat], specs, c, rows, m, warps, interpret)


def _grad_sums_kernel(dy, x, params, *, relu, rows, warps, interpret):
    from jax.experimental import pallas as pl

    def kernel(dy_ref, x_ref, p_ref, s_ref, q_ref):
        mean, rstd = p_ref[0, :], p_ref[1, :]
        xhat = (x_ref[...].astype(F32) - mean[None, :]) * rstd[None, :]
        g = dy_ref[...].astype(F32)
        if relu:
            scale, bias = p_ref[2, :], p_ref[3, :]
            g = jnp.where(xhat * scale[None, :] + bias[None, :] > 0, g, 0.0)
        s_ref[...] = g.sum(0)
        q_ref[...] = (g * xhat).sum(0)

    dflat, xflat = _rows(dy), _rows(x)
    m, c = xflat.shape
    block = pl.BlockSpec((rows, c), lambda i: (i, 0))
    specs = [block, block, pl.BlockSpec((4, c), lambda i: (0, 0))]
    return _call(kernel, [dflat, xflat, params], specs, c, rows, m, warps, interpret)
