"""Max pooling whose backward pass is a gather, not XLA's select-and-scatter (a slow kernel).

The forward records the offset of each window's first maximum (row-major, as
select-and-scatter chooses), in a byte; the backward sums into each input the gradients of the
windows that chose it: in XLA, or on GPUs for ResNet's stem pool in a Pallas kernel, which
reads and writes at the memory's rate where XLA's fusion does not. Equal to
``flax.linen.max_pool``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["interpreted", "kernel_backward", "kernel_fits", "kernel_takes", "max_pool",
           "phase_backward"]


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


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def _backward(window, strides, padding, residuals, dy):
    first, like = residuals
    if _on_gpu() and kernel_fits(window, strides, padding, like, dy):
        return (kernel_backward(first, dy, like.dtype),)
    return (phase_backward(window, strides, padding, first, like, dy),)


def phase_backward(window, strides, padding, first, like, dy):
    """The input gradient in XLA: per stride phase, a sum of a few shifted output-sized
    arrays, then the phases interleaved (not k*k full-size, interior-padded copies: a far
    larger kernel)."""
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
    return _unpadded(jnp.stack(rows, axis=2), like, padding)


_max_pool.defvjp(_pool, _backward)


def kernel_fits(window, strides, padding, like, dy) -> bool:
    """Whether ``kernel_backward`` takes this pool: ResNet's stem pool (3x3, stride 2, one
    row and column of padding) over ``like``'s height and width and ``dy``'s channels, where
    ``kernel_takes`` them (``like`` holds no channels)."""
    return (tuple(window) == (3, 3) and tuple(strides) == (2, 2)
            and tuple(map(tuple, padding)) == ((1, 1), (1, 1))
            and kernel_takes(*like.shape[1:3], dy.shape[-1]))


def kernel_takes(height: int, width: int, channels: int) -> bool:
    """Whether the stem pool's kernels take an input of this size: even height and width, a
    power-of-two channel count."""
    return height % 2 == 0 and width % 2 == 0 and channels > 0 and channels & (channels - 1) == 0


def kernel_backward(first, dy, dtype, *, interpret: bool | None = None):
    """The input gradient of a 3x3, stride-2 pool with one row and column of padding, as one
    Pallas (Triton) kernel: XLA's loop fusion for the same sums loads one element at a time
    (the padding's bounds checks) and reaches a fifth of the memory's rate.

    Input row 2q takes window row q (its offset row 1); row 2q+1 takes row q+1 (offset row 0)
    and row q (offset row 2); columns alike. Each program writes the four (row, column)
    phases of one window row, adding the terms in ``phase_backward``'s order, so the result
    is bit-equal to it.

    Args:
      first: (N, Ho, Wo, C) first-maximum offsets from the forward.
      dy: (N, Ho, Wo, C) gradient of the pool's output.
      dtype: the input's dtype.
      interpret: run in Pallas's interpreter; None: unless the backend is a GPU.

    Returns:
      (N, 2 Ho, 2 Wo, C) input gradient.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    n, ho, wo, c = dy.shape
    width = pl.next_power_of_2(wo)
    f32 = jnp.float32

    def kernel(first_ref, dy_ref, dx_ref):
        b, q = pl.program_id(0), pl.program_id(1)
        cols = jnp.arange(width)[:, None]
        below = jnp.minimum(q + 1, ho - 1)
        # Column blocks starting at window column 0 and 1, masked past Wo; their starts are
        # traced, as Pallas refuses a static slice that runs past the array.
        start = q * 0
        blocks = {shift: (pl.ds(start + shift, width), cols + shift < wo) for shift in (0, 1)}
        tiles = {}  # (window row q or q+1, column shift): (offsets, gradient); masked: none
        for down, row, valid in ((0, q, True), (1, below, q + 1 < ho)):
            for shift, (index, inside) in blocks.items():
                mask = inside & valid
                tiles[down, shift] = (
                    plgpu.load(first_ref.at[b, row, index, :], mask=mask, other=-1),
                    plgpu.load(dy_ref.at[b, row, index, :], mask=mask, other=0).astype(f32))

        def term(down, shift, k):
            chosen, values = tiles[down, shift]
            return jnp.where(chosen == k, values, 0.0)

        zero = jnp.zeros((width, c), f32)
        phases = (
            (0, 0, zero + term(0, 0, 4)),
            (0, 1, zero + term(0, 1, 3) + term(0, 0, 5)),
            (1, 0, zero + term(1, 0, 1) + term(0, 0, 7)),
            (1, 1, zero + term(1, 1, 0) + term(1, 0, 2) + term(0, 1, 6) + term(0, 0, 8)))
        for row_phase, col_phase, total in phases:
            index, inside = blocks[0]
            # the row phase as an array: Pallas's interpreter stores through no Python int
            plgpu.store(dx_ref.at[b, q, jnp.int32(row_phase), index, pl.ds(col_phase * c, c)],
                        total.astype(dtype), mask=inside)

    dx = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((n, ho, 2, wo, 2 * c), dtype), grid=(n, ho),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpreted(interpret), name="max_pool_backward")(first, dy)
    return dx.reshape(n, 2 * ho, 2 * wo, c)


def interpreted(interpret: bool | None) -> bool:
    """A Pallas kernel's ``interpret``: None means unless the backend is a GPU."""
    return jax.default_backend() != "gpu" if interpret is None else interpret
