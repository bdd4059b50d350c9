"""The hash generator behind initial weights: distributions, independent streams, and the
small program it was written for."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from jaxflowers.models import cifar_net, init_rng

N = 200_000


def _uniform(key, n=N):
    return np.asarray(jax.random.uniform(key, (n,)), np.float64)


def test_same_seed_same_values_and_other_seeds_differ():
    a, b = _uniform(init_rng.key(7)), _uniform(init_rng.key(7))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, _uniform(init_rng.key(8)))


def test_normal_moments_and_uniform_histogram():
    z = np.asarray(jax.random.normal(init_rng.key(0), (N,)), np.float64)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert abs(np.mean(z**3)) < 0.03 and abs(np.mean(z**4) - 3) < 0.06
    counts = np.bincount((_uniform(init_rng.key(1)) * 64).astype(int), minlength=64)
    expected = N / 64
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 130, chi2  # 63 degrees of freedom: p < 1e-6 beyond ~125


@pytest.mark.parametrize("width", [8, 16, 32])
def test_every_bit_is_balanced(width):
    dtype = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32}[width]
    bits = np.asarray(jax.random.bits(init_rng.key(3), (50_000,), dtype))
    assert bits.dtype == np.dtype(dtype)
    ones = [np.mean((bits >> i) & 1) for i in range(width)]
    np.testing.assert_allclose(ones, 0.5, atol=0.01)


def test_64_bit_draws_with_x64_enabled():
    code = ("import jax, numpy as np, jax.numpy as jnp; from jaxflowers.models import init_rng;"
            "b = np.asarray(jax.random.bits(init_rng.key(3), (50_000,), jnp.uint64));"
            "print(b.dtype, *[np.mean((b >> i) & 1) for i in range(64)])")
    env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "uint64"
    np.testing.assert_allclose([float(v) for v in out[1:]], 0.5, atol=0.01)


def test_split_folded_and_neighbouring_keys_give_unrelated_streams():
    parent = init_rng.key(0)
    streams = {
        "parent": parent,
        "split 0": jax.random.split(parent)[0],
        "split 1": jax.random.split(parent)[1],
        "fold 0": jax.random.fold_in(parent, 0),
        "fold 1": jax.random.fold_in(parent, 1),
        "seed 1": init_rng.key(1),
    }
    values = {name: _uniform(k) for name, k in streams.items()}
    bits = {name: np.asarray(jax.random.bits(k, (N,))) for name, k in streams.items()}
    names = list(values)
    bound = 5 / np.sqrt(N)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            corr = np.corrcoef(values[a], values[b])[0, 1]
            assert abs(corr) < bound, (a, b, corr)
            # Not a shifted copy either (a counter generator's classic failure): by chance
            # 5,000 x 200,000 uint32 draws share ~0.2 values.
            assert len(np.intersect1d(bits[a][:5000], bits[b])) < 5, (a, b)
    children = np.asarray(jax.random.key_data(jax.random.split(parent, 1000)))
    assert len(np.unique(children, axis=0)) == 1000


def test_initialisers_draw_their_distributions():
    # He normal (ResNets): normal, std sqrt(2 / fan_out), 4.55% of it beyond 2 std.
    he = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
    kernel = np.asarray(he(init_rng.key(0), (3, 3, 64, 128)), np.float64)
    std = np.sqrt(2 / (9 * 128))
    np.testing.assert_allclose(kernel.std(), std, rtol=0.02)
    np.testing.assert_allclose(np.mean(np.abs(kernel) > 2 * std), 0.0455, atol=0.004)
    # Glorot uniform (cifar_net, through flax's init): std sqrt(2 / (fan_in + fan_out)).
    variables = cifar_net(2).init(init_rng.key(0), jnp.zeros((1, 32, 32, 3)), train=False)
    kernels = [np.asarray(leaf) for path, leaf in
               jax.tree_util.tree_leaves_with_path(variables["params"])
               if "kernel" in jax.tree_util.keystr(path) and leaf.ndim == 4]
    assert kernels
    for kernel in kernels:
        fans = 9 * kernel.shape[2] + 9 * kernel.shape[3]
        np.testing.assert_allclose(kernel.std(), np.sqrt(2 / fans), rtol=0.15)
        assert np.abs(kernel).max() <= np.sqrt(6 / fans)
    assert len({float(k.ravel()[0]) for k in kernels}) == len(kernels)  # own keys


def test_the_init_program_is_a_fraction_of_an_rbg_one():
    """Why the module exists: flax calls the generator once per parameter, and each call of
    JAX's own generators compiles into its own expanded kernels."""
    model = cifar_net(2)

    def compiled_lines(key):
        init = jax.jit(lambda: model.init(key, jnp.zeros((1, 32, 32, 3)), train=False))
        return len(init.lower().compile().as_text().splitlines())

    assert compiled_lines(init_rng.key(0)) * 3 < compiled_lines(jax.random.key(0, impl="rbg"))
