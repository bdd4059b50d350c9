"""A 1x1 convolution between two batch norms, as matrix products over M = N*H*W rows, for
``fused_gemm.py``: XLA's chain of kernels as the model runs it, and Pallas (Triton) kernels
that fold batch norm's apply and ReLU into the product's loads and its sums into the
product's stores. ``x`` (M, K) bfloat16 is the raw output of the layer before; ``p`` (4, K)
float32 holds the mean, reciprocal deviation, scale and offset of its batch norm; ``w``
(K, N) is the 1x1 kernel. A config ``(R, C, S, warps, stages)`` tiles each kernel's output
R x C and steps S along the contracted axis; tiles are clamped to the array.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

F32, BF16 = jnp.float32, jnp.bfloat16
_SM_PROGRAMS = 528  # programs the weight-gradient kernel aims for: 4 per SM of an H100


def _normalized(x, p):
    """``xhat`` and ``relu(xhat * scale + offset)`` as float32, and the ReLU's mask; ``p``:
    batch norm's four rows (in a kernel, each loaded from its ref on its own)."""
    mean, rstd, scale, offset = p
    xhat = (x.astype(F32) - mean) * rstd
    pre = xhat * scale + offset
    return xhat, jnp.maximum(pre, 0.0), pre > 0


# ---------------------------------------------------------------- XLA, as the model runs


def forward_chain(x, w, p):
    """Apply + ReLU, the product, and the product's sums of ``o`` and ``o**2``."""
    z = _normalized(x, p)[1].astype(BF16)
    o = jnp.dot(z, w, preferred_element_type=F32).astype(BF16)
    of = o.astype(F32)
    return o, jnp.stack([of.sum(0), jnp.square(of).sum(0)])


def _input_gradient(g, xhat, p, sums):
    """Batch norm's input gradient from the masked gradient ``g`` and its two sums."""
    m = g.shape[0]
    return ((p[2] * p[1] / m) * (m * g - sums[0] - xhat * sums[1])).astype(BF16)


def backward_chain(x, do, w, p):
    """The layer's backward from the output's gradient ``do``: the input's gradient through
    batch norm, the kernel's gradient, and batch norm's sums (its offset and scale
    gradients)."""
    xhat, z, mask = _normalized(x, p)
    dz = jnp.dot(do, w.T, preferred_element_type=F32).astype(BF16)
    dw = jnp.dot(z.astype(BF16).T, do, preferred_element_type=F32)
    g = jnp.where(mask, dz.astype(F32), 0.0)
    sums = jnp.stack([g.sum(0), (g * xhat).sum(0)])
    return _input_gradient(g, xhat, p, sums), dw, sums


def backward_products(x, do, w, p):
    """The backward's two products alone, on a ready ``z``: the floor of ``backward_chain``."""
    del p
    dz = jnp.dot(do, w.T, preferred_element_type=F32).astype(BF16)
    return dz, jnp.dot(x.T, do, preferred_element_type=F32)


def product(x, w, p):
    del p
    return jnp.dot(x, w, preferred_element_type=F32).astype(BF16)


# ---------------------------------------------------------------- Pallas


def _call(kernel, *, grid, in_specs, out_shape, out_specs, config, interpret, name):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    return pl.pallas_call(
        kernel, out_shape=out_shape, grid=grid, in_specs=in_specs, out_specs=out_specs,
        compiler_params=plgpu.CompilerParams(num_warps=config[3], num_stages=config[4]),
        interpret=interpret, name=name)


def _dot(a, b, contract):
    """``a`` x ``b`` contracting axis ``contract[0]`` of ``a`` with ``contract[1]`` of ``b``."""
    return jax.lax.dot_general(a, b, ((contract[:1], contract[1:]), ((), ())),
                               preferred_element_type=F32)


def _rows(p_ref, cols):
    """Batch norm's four rows of ``p_ref``, each loaded on its own (Triton cannot slice a
    loaded block)."""
    return [p_ref[i, cols] for i in range(4)]


def _part_sums(parts, blocks, n):
    return jnp.stack([q.reshape(blocks, n).sum(0) for q in parts])


def pallas_forward(x, w, p, *, config, fused, interpret=False):
    """``x @ w`` in one kernel; ``fused``: ``forward_chain``'s outputs from one kernel (the
    apply in the loads, the sums per row block in the stores, summed by XLA after)."""
    from jax.experimental import pallas as pl

    (m, k), n = x.shape, w.shape[1]
    bm, bn, bk = min(config[0], m), min(config[1], n), min(config[2], k)
    grid = (m // bm, n // bn)

    def kernel(x_ref, w_ref, p_ref, o_ref, *sums):
        def body(i, acc):
            cols = pl.ds(i * bk, bk)
            a = x_ref[:, cols]
            if fused:
                a = _normalized(a, _rows(p_ref, cols))[1].astype(BF16)
            return acc + _dot(a, w_ref[cols, :], (1, 0))

        acc = jax.lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), F32))
        o = acc.astype(BF16)
        o_ref[...] = o
        if fused:
            of = o.astype(F32)
            sums[0][...] = of.sum(0)
            sums[1][...] = (of * of).sum(0)

    out_shape = [jax.ShapeDtypeStruct((m, n), BF16)]
    out_specs = [pl.BlockSpec((bm, bn), lambda i, j: (i, j))]
    if fused:
        out_shape += [jax.ShapeDtypeStruct((grid[0] * n,), F32)] * 2
        out_specs += [pl.BlockSpec((bn,), lambda i, j: (i * grid[1] + j,))] * 2
    outs = _call(kernel, grid=grid, out_shape=out_shape, out_specs=out_specs, config=config,
                 in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                           pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                           pl.BlockSpec((4, k), lambda i, j: (0, 0))],
                 interpret=interpret, name="fused_forward" if fused else "product")(x, w, p)
    return (outs[0], _part_sums(outs[1:], grid[0], n)) if fused else outs[0]


def _input_gradient_kernel(do, w, x, p, config, interpret):
    """``g``, the masked gradient ``do @ w.T`` (rounded to bfloat16 as XLA's product is),
    and its sums of ``g`` and ``g * xhat`` over the rows."""
    from jax.experimental import pallas as pl

    (m, n), k = do.shape, w.shape[0]
    bm, bk, bn = min(config[0], m), min(config[1], k), min(config[2], n)
    grid = (m // bm, k // bk)

    def kernel(do_ref, w_ref, x_ref, p_ref, g_ref, s0_ref, s1_ref):
        def body(i, acc):
            cols = pl.ds(i * bn, bn)
            return acc + _dot(do_ref[:, cols], w_ref[:, cols], (1, 1))

        dz = jax.lax.fori_loop(0, n // bn, body, jnp.zeros((bm, bk), F32))
        xhat, _, mask = _normalized(x_ref[...], _rows(p_ref, slice(None)))
        g = jnp.where(mask, dz.astype(BF16).astype(F32), 0.0)
        g_ref[...] = g.astype(BF16)
        s0_ref[...] = g.sum(0)
        s1_ref[...] = (g * xhat).sum(0)

    part = jax.ShapeDtypeStruct((grid[0] * k,), F32)
    part_spec = pl.BlockSpec((bk,), lambda i, j: (i * grid[1] + j,))
    g, *parts = _call(
        kernel, grid=grid, config=config, interpret=interpret, name="input_gradient",
        in_specs=[pl.BlockSpec((bm, n), lambda i, j: (i, 0)),
                  pl.BlockSpec((bk, n), lambda i, j: (j, 0)),
                  pl.BlockSpec((bm, bk), lambda i, j: (i, j)),
                  pl.BlockSpec((4, bk), lambda i, j: (0, j))],
        out_shape=[jax.ShapeDtypeStruct((m, k), BF16), part, part],
        out_specs=[pl.BlockSpec((bm, bk), lambda i, j: (i, j)), part_spec, part_spec],
    )(do, w, x, p)
    return g, _part_sums(parts, grid[0], k)


def _splits(rows: int, step: int, tiles: int) -> int:
    """Row groups for the weight gradient: a divisor of ``rows // step`` that brings the
    programs near ``_SM_PROGRAMS``."""
    chunks = rows // step
    target = max(1, _SM_PROGRAMS // tiles)
    return max(d for d in range(1, chunks + 1) if chunks % d == 0 and d <= target)


def _kernel_gradient_kernel(x, do, p, config, interpret):
    """``relu(bn(x)).T @ do`` with ``relu(bn(x))`` computed as it loads, the rows split in
    groups whose partial products XLA sums after."""
    from jax.experimental import pallas as pl

    (m, k), n = x.shape, do.shape[1]
    bk, bn, bm = min(config[0], k), min(config[1], n), min(config[2], m)
    splits = _splits(m, bm, (k // bk) * (n // bn))
    rows = m // splits
    grid = (k // bk, n // bn, splits)

    def kernel(x_ref, do_ref, p_ref, dw_ref):
        def body(i, acc):
            r = pl.ds(i * bm, bm)
            z = _normalized(x_ref[r, :], _rows(p_ref, slice(None)))[1].astype(BF16)
            return acc + _dot(z, do_ref[r, :], (0, 0))

        dw_ref[...] = jax.lax.fori_loop(0, rows // bm, body, jnp.zeros((bk, bn), F32))

    parts = _call(
        kernel, grid=grid, config=config, interpret=interpret, name="kernel_gradient",
        in_specs=[pl.BlockSpec((rows, bk), lambda a, b, s: (s, a)),
                  pl.BlockSpec((rows, bn), lambda a, b, s: (s, b)),
                  pl.BlockSpec((4, bk), lambda a, b, s: (0, a))],
        out_shape=jax.ShapeDtypeStruct((splits * k, n), F32),
        out_specs=pl.BlockSpec((bk, bn), lambda a, b, s: (s * grid[0] + a, b)),
    )(x, do, p)
    return parts.reshape(splits, k, n).sum(0)


def pallas_backward(x, do, w, p, *, config, interpret=False):
    """``backward_chain``'s outputs from two fused kernels and XLA's last elementwise pass."""
    g, sums = _input_gradient_kernel(do, w, x, p, config, interpret)
    dw = _kernel_gradient_kernel(x, do, p, config, interpret)
    return _input_gradient(g.astype(F32), _normalized(x, p)[0], p, sums), dw, sums
