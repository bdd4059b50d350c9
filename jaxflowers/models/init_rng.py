"""The random generator behind initial weights: a counter-based hash, quick to compile.

flax compiles each parameter's draw into its own kernels, on a cold start's critical path; each
value here is two rounds of the "lowbias32" finaliser over its position and the key. flax's
initialisers use it through ``key(seed)``; augmentation keeps JAX's threefry.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import define_prng_impl

__all__ = ["IMPL", "key"]

_U32 = jnp.uint32
_GOLDEN = 0x9E3779B9  # odd, so counter * _GOLDEN visits every uint32 once
_SPLIT, _FOLD = 0x5BD1E995, 0x1B873593  # domain tags: split and fold_in keys are not bits


def _finalise(x):
    """lowbias32 (C. Wellons' hash prospector): a bijection of uint32 with strong avalanche."""
    x = x ^ (x >> 16)
    x = x * _U32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * _U32(0x846CA68B)
    return x ^ (x >> 16)


def _hash(key, counter, tag: int = 0):
    """uint32 bits for each uint32 ``counter`` under ``key`` (uint32 (2,))."""
    x = _finalise(counter * _U32(_GOLDEN) + (key[0] ^ _U32(tag)))
    return _finalise(x ^ key[1])


def _seed(seed):
    seed = jnp.asarray(seed)
    low = seed.astype(_U32)
    high = (seed >> 32).astype(_U32) if seed.dtype.itemsize == 8 else _U32(0)
    return jnp.stack([_finalise(low ^ _U32(0x243F6A88)), _finalise(high + _U32(0x85A308D3))])


def _pairs(key, counter, tag: int):
    """New keys (..., 2) from the even and odd counters ``2 * counter`` and ``+ 1``."""
    return jnp.stack([_hash(key, 2 * counter, tag), _hash(key, 2 * counter + 1, tag)], axis=-1)


def _split(key, shape):
    count = int(np.prod(shape))
    return _pairs(key, lax.iota(_U32, count), _SPLIT).reshape(*shape, 2)


def _fold_in(key, data):
    return _pairs(key, jnp.asarray(data).astype(_U32), _FOLD)


def _random_bits(key, bit_width: int, shape):
    count = int(np.prod(shape))
    if bit_width == 64:
        words = _hash(key, lax.iota(_U32, 2 * count)).astype(jnp.uint64)
        return ((words[0::2] << 32) | words[1::2]).reshape(shape)
    bits = _hash(key, lax.iota(_U32, count)).reshape(shape)
    if bit_width == 32:
        return bits
    # The high bits: the finaliser's last xor-shift mixes them best.
    return (bits >> (32 - bit_width)).astype({8: jnp.uint8, 16: jnp.uint16}[bit_width])


IMPL = define_prng_impl(key_shape=(2,), seed=_seed, split=_split, random_bits=_random_bits,
                        fold_in=_fold_in, name="jaxflowers_hash32", tag="jfh")


def key(seed: int) -> jax.Array:
    """A typed JAX key for initial weights: ``model.init(key(seed), ...)``."""
    return jax.random.key(seed, impl=IMPL)
