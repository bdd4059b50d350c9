"""Max pooling whose backward pass is a gather, not XLA's select-and-scatter (a slow kernel).

The forward records the offset of each window's first maximum (row-major, as
select-and-scatter chooses), in a byte; the backward sums into each input the gradients of the
windows that chose it. Equal to ``flax.linen.max_pool``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["max_pool"]


def max_pool(x, window: tuple[int, int], strides: tuple[int, int] | None = None,
             padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0)), *,
             train: bool = True):
    """Max pooling of NHWC ``x``; ``strides`` default to the window, ``padding`` never wins.

    ``train=False``: the same values as the maximum of the window's strided slices, which
    ONNX converters and runtimes take (onnxruntime refuses a 4-D ``reduce_window``'s pool).
    """
    strides, padding = tuple(strides or window), tuple(tuple(p) for p in padding)
    if not train:
        return _sliced_max(x, tuple(window), strides, padding)
    return _max_pool(x, tuple(window), strides, padding)


def _sliced_max(x, window, strides, padding):
    """The max pool as the elementwise maximum of ``kh * kw`` strided slices."""
    (kh, kw), (sh, sw) = window, strides
    xp = jnp.pad(x, ((0, 0), *padding, (0, 0)), constant_values=-jnp.inf)
    n, hp, wp, c = xp.shape
    ho, wo = (hp - kh) // sh + 1, (wp - kw) // sw + 1
    out = None
    for di in range(kh):
        for dj in range(kw):
            part = lax.slice(xp, (0, di, dj, 0), (n, di + sh * (ho - 1) + 1,
                                                  dj + sw * (wo - 1) + 1, c), (1, sh, sw, 1))
            out = part if out is None else jnp.maximum(out, part)
    return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _max_pool(x, window, strides, padding):
    # A Python -inf makes this XLA's max-pool primitive (reduce_window_max), which ONNX
    # converters know, rather than a reduction with a traced initial value.
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, *window, 1), (1, *strides, 1),
                             ((0, 0), *padding, (0, 0)))


def _pool(x, window, strides, padding):
    y = _max_pool(x, window, strides, padding)
    # x's height, width and dtype ride on an empty array: residuals are arrays.
    return y, (_first_maximum(x, y, window, strides, padding),
               jnp.zeros((0, *x.shape[1:3], 0), x.dtype))


def _first_maximum(x, y, window, strides, padding):
    """Offset (row-major in the window) of each window's first maximum, ``kh * kw`` for none
    (NaN): what the backward needs of the forward, one byte per output for windows of up to
    127 elements, so the backward neither keeps ``x`` nor recomputes this per input."""
    (kh, kw), (sh, sw) = window, strides
    xp = jnp.pad(x, ((0, 0), *padding, (0, 0)), constant_values=-jnp.inf)
    n, _, _, c = xp.shape
    ho, wo = y.shape[1:3]
    span_h, span_w = sh * (ho - 1) + 1, sw * (wo - 1) + 1
    dtype = jnp.int8 if kh * kw <= 127 else jnp.int32
    first = jnp.full(y.shape, kh * kw, dtype)
    for k in reversed(range(kh * kw)):
        di, dj = divmod(k, kw)
        candidate = lax.slice(xp, (0, di, dj, 0), (n, di + span_h, dj + span_w, c),
                              (1, sh, sw, 1))
        first = jnp.where(candidate == y, jnp.asarray(k, dtype), first)
    return first


def _phase_grid(like, strides, padding) -> tuple[int, int]:
    """Rows and columns of each stride phase's grid over the padded input (``like`` has the
    input's shape)."""
    (top, bottom), (left, right) = padding
    return (-(-(like.shape[1] + top + bottom) // strides[0]),
            -(-(like.shape[2] + left + right) // strides[1]))


def _chosen_term(first, dy, k, window, strides, grid):
    """The float32 gradient of the windows whose first maximum is at offset ``k``, placed in
    its phase's ``grid``: input position i = s*q + p (phase p = i mod s) is in the windows
    o = q - m whose offset d = p + s*m is < k."""
    mh, mw = k // window[1] // strides[0], k % window[1] // strides[1]
    (ho, wo), (qh, qw) = dy.shape[1:3], grid
    return lax.pad(jnp.where(first == k, dy.astype(jnp.float32), 0.0), jnp.float32(0),
                   ((0, 0, 0), (mh, qh - ho - mh, 0), (mw, qw - wo - mw, 0), (0, 0, 0)))


def _unpadded(phases, like, padding):
    """The input's gradient from the interleaved phases (n, qh, sh, qw, sw, c)."""
    n, qh, sh, qw, sw, c = phases.shape
    (top, _), (left, _) = padding
    dx = phases.reshape(n, qh * sh, qw * sw, c)[:, top:top + like.shape[1],
                                                left:left + like.shape[2], :]
    return dx.astype(like.dtype)


def _backward(window, strides, padding, residuals, dy):
    # Per phase, a sum of a few shifted output-sized arrays, then the phases interleaved (not
    # k*k full-size, interior-padded copies: a far larger kernel).
    first, like = residuals
    (kh, kw), (sh, sw) = window, strides
    grid = _phase_grid(like, strides, padding)
    rows = []
    for ph in range(sh):
        cols = []
        for pw in range(sw):
            total = jnp.zeros((dy.shape[0], *grid, dy.shape[3]), jnp.float32)
            for di in range(ph, kh, sh):
                for dj in range(pw, kw, sw):
                    total = total + _chosen_term(first, dy, di * kw + dj, window, strides, grid)
            cols.append(total)
        rows.append(jnp.stack(cols, axis=3))  # (n, qh, qw, sw, c)
    return (_unpadded(jnp.stack(rows, axis=2), like, padding),)


_max_pool.defvjp(_pool, _backward)
