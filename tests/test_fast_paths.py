"""The hand-written fast paths equal the straightforward versions: batch norm (+ ReLU)
against flax.linen.BatchNorm, max pooling against flax.linen.max_pool, the flat optimizer
against the per-leaf one."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jaxflowers as jf
from jaxflowers.models.norm import BatchNorm
from jaxflowers.models.pool import max_pool
from jaxflowers.optim import make_optimizer

X = jax.random.normal(jax.random.PRNGKey(0), (8, 5, 5, 6)) * 2 + 1
W = jax.random.normal(jax.random.PRNGKey(2), X.shape)
PARAMS = {"scale": jnp.linspace(0.5, 1.5, 6), "bias": jnp.linspace(-1, 1, 6)}
STATS = {"mean": jnp.full(6, 0.3), "var": jnp.full(6, 2.0)}


def _reference(relu, dtype=jnp.float32, axis_name=None, train=True):
    bn = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, dtype=dtype,
                      axis_name=axis_name)
    return lambda v, x: (lambda y, u: ((nn.relu(y) if relu else y), u))(
        *bn.apply(v, x, mutable=["batch_stats"]))


def _ours(relu, dtype=jnp.float32, axis_name=None, train=True):
    bn = BatchNorm(use_running_average=not train, dtype=dtype, axis_name=axis_name, relu=relu)
    return lambda v, x: bn.apply(v, x, mutable=["batch_stats"])


def _loss_and_grads(apply, x, w):
    def loss(params, x):
        y, updates = apply({"params": params, "batch_stats": STATS}, x)
        return jnp.sum(y.astype(jnp.float32) * w), updates["batch_stats"]
    (value, stats), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(PARAMS, x)
    return value, grads, stats


def _assert_close(a, b, rtol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
        assert np.max(np.abs(x - y)) <= rtol * (np.max(np.abs(y)) + 1e-6)


@pytest.mark.parametrize("relu", [False, True])
def test_same_outputs_gradients_and_running_stats_as_flax(relu):
    ours = _loss_and_grads(_ours(relu), X, W)
    ref = _loss_and_grads(_reference(relu), X, W)
    _assert_close(ours, ref, 1e-5)
    # The running averages moved: momentum 0.9 towards the batch statistics.
    assert not np.allclose(ours[2]["mean"], STATS["mean"])


def test_bfloat16_compute_matches_flax_within_bfloat16_rounding():
    ours = _loss_and_grads(_ours(True, jnp.bfloat16), X.astype(jnp.bfloat16), W)
    ref = _loss_and_grads(_reference(True, jnp.bfloat16), X.astype(jnp.bfloat16), W)
    _assert_close(ours, ref, 2e-2)
    assert ours[1][1].dtype == jnp.bfloat16 and ours[1][0]["scale"].dtype == jnp.float32


def test_inference_uses_running_statistics():
    variables = {"params": PARAMS, "batch_stats": STATS}
    ours, _ = _ours(True, train=False)(variables, X)
    ref, _ = _reference(True, train=False)(variables, X)
    _assert_close(ours, ref, 1e-6)


def test_synchronised_statistics_and_input_gradients_match_flax_on_four_devices():
    mesh = Mesh(np.asarray(jax.devices()[:4]), ("data",))

    def per_device(apply):
        def run(params, x, w):
            def loss(params, x):
                y, upd = apply({"params": params, "batch_stats": STATS}, x)
                return jnp.sum(y * w), upd["batch_stats"]
            (value, stats), (gp, gx) = jax.value_and_grad(loss, argnums=(0, 1),
                                                          has_aux=True)(params, x)
            return value[None], jax.lax.pmean(gp, "data"), gx, stats
        return jax.jit(jax.shard_map(run, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                                     out_specs=(P("data"), P(), P("data"), P()),
                                     check_vma=False))

    ours = per_device(_ours(True, axis_name="data"))(PARAMS, X, W)
    ref = per_device(_reference(True, axis_name="data"))(PARAMS, X, W)
    _assert_close(ours, ref, 1e-5)
    # Pooled statistics: the running mean moved towards the mean of all 8 samples.
    expected = 0.9 * 0.3 + 0.1 * np.asarray(X).reshape(-1, 6).mean(0)
    np.testing.assert_allclose(ours[3]["mean"], expected, rtol=1e-5)


@pytest.mark.parametrize("solver", ["adam", "sgdm"])
def test_flat_optimizer_updates_equal_per_leaf_updates(solver):
    opts = jf.TrainingOptions(solver=solver, initial_learn_rate=0.1, l2_regularization=1e-3)
    params = {"a": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": {"c": jnp.arange(5.0)}}
    results = []
    for flat in (False, True):
        tx, p = make_optimizer(opts, 2, flat=flat), params
        state = tx.init(p)
        for step in range(3):
            grads = jax.tree.map(lambda x: jnp.cos(x * (step + 1)), p)
            updates, state = tx.update(grads, state, p)
            p = optax.apply_updates(p, updates)
        results.append(p)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), *results)
    assert not np.allclose(results[0]["a"], params["a"])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape, window, strides, padding", [
    ((2, 9, 9, 3), (3, 3), (2, 2), ((1, 1), (1, 1))),  # ResNet's stem pool
    ((2, 10, 7, 2), (3, 3), (2, 2), ((1, 1), (1, 1))),  # odd sizes
    ((2, 8, 8, 3), (2, 2), (2, 2), ((0, 0), (0, 0))),  # cifar_net's pools
])
def test_max_pool_values_and_gradients_equal_flax_also_with_ties(dtype, shape, window, strides,
                                                                  padding):
    rng = np.random.default_rng(0)
    # ReLU outputs: many zeros, so many windows hold several maxima (ties).
    x = jnp.asarray(np.maximum(rng.integers(-3, 4, shape), 0), dtype)
    expected = nn.max_pool(x, window, strides, padding)
    weights = jnp.arange(1.0, expected.size + 1).reshape(expected.shape)

    def loss(pool):
        return lambda x: jnp.sum(pool(x, window, strides, padding).astype(jnp.float32) * weights)

    np.testing.assert_array_equal(max_pool(x, window, strides, padding), expected)
    ours, ref = jax.grad(loss(max_pool))(x), jax.grad(loss(nn.max_pool))(x)
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(ref, np.float32))
    assert float(jnp.sum(ref)) > 0
