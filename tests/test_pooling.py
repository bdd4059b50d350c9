"""The max pool's forward and backward, and on GPUs its Pallas kernels (run here in Pallas's
interpreter): equal to flax's pool and to the XLA phases, bit for bit."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxflowers as jf
from jaxflowers.models.maxpool import max_pool


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape, window, strides, padding", [
    ((2, 9, 9, 3), (3, 3), (2, 2), ((1, 1), (1, 1))),  # ResNet's stem pool
    ((2, 10, 7, 2), (3, 3), (2, 2), ((1, 1), (1, 1))),  # odd sizes
    ((2, 8, 8, 3), (2, 2), (2, 2), ((0, 0), (0, 0))),  # cifar_net's pools
    ((1, 7, 6, 2), (3, 2), (1, 1), ((1, 1), (0, 1))),  # stride 1: one phase, shifts only
    ((1, 11, 9, 2), (2, 3), (3, 2), ((0, 2), (1, 0))),  # stride above the window: empty phases
    ((1, 14, 13, 2), (12, 12), (1, 1), ((0, 0), (0, 0))),  # offsets beyond a byte's 127
])
def test_max_pool_values_and_gradients_equal_flax_also_with_ties(dtype, shape, window, strides,
                                                                  padding):
    rng = np.random.default_rng(0)
    # ReLU outputs: many zeros, so many windows hold several maxima (ties).
    x = jnp.asarray(np.maximum(rng.integers(-3, 4, shape), 0), dtype)
    expected = nn.max_pool(x, window, strides, padding)
    weights = jnp.arange(1.0, expected.size + 1).reshape(expected.shape)

    def grad(pool):  # compiled whole, as in training (and quicker than op by op)
        return jax.jit(jax.grad(
            lambda x: jnp.sum(pool(x, window, strides, padding).astype(jnp.float32) * weights)))

    pooled = jax.jit(max_pool, static_argnums=(1, 2, 3))(x, window, strides, padding)
    np.testing.assert_array_equal(pooled, expected)
    ours, ref = grad(max_pool)(x), grad(nn.max_pool)(x)
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(ref, np.float32))
    assert float(jnp.sum(ref)) > 0


@pytest.mark.parametrize("dtype,shape,fits", [
    (jnp.float32, (2, 8, 8, 16), True),
    (jnp.bfloat16, (2, 12, 10, 8), True),  # width not a power of two: masked columns
    (jnp.bfloat16, (1, 6, 14, 4), True),
    (jnp.bfloat16, (1, 7, 8, 4), False),  # odd height: the XLA phases instead
    (jnp.bfloat16, (1, 8, 8, 6), False),  # channels not a power of two
])
def test_stem_pool_kernel_equals_the_xla_backward_on_gpus(monkeypatch, dtype, shape, fits):
    from jaxflowers.models import maxpool

    used = []
    kernel = maxpool.kernel_backward
    monkeypatch.setattr(maxpool, "_on_gpu", lambda: True)  # the kernel in Pallas's interpreter
    monkeypatch.setattr(maxpool, "kernel_backward",
                        lambda *a, **k: used.append(1) or kernel(*a, **k))
    rng = np.random.default_rng(1)
    x = jnp.asarray(np.maximum(rng.integers(-3, 4, shape), 0), dtype)  # many ties
    args = ((3, 3), (2, 2), ((1, 1), (1, 1)))
    weights = jnp.asarray(rng.normal(size=nn.max_pool(x, *args).shape), jnp.float32)

    def grad(pool):
        return jax.grad(lambda x: jnp.sum(pool(x, *args).astype(jnp.float32) * weights))(x)

    ours = grad(max_pool)
    assert used == ([1] if fits else [])
    monkeypatch.setattr(maxpool, "_on_gpu", lambda: False)
    # bit for bit, the order of each sum included (random weights), so also equal to flax
    # (the test above)
    np.testing.assert_array_equal(np.asarray(ours, np.float32),
                                  np.asarray(grad(max_pool), np.float32))
    assert float(jnp.sum(ours != 0)) > 0


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_resnet_stem_pool_kernel_trains_like_batch_norm_then_max_pool(monkeypatch, dtype):
    """On GPUs ResNet's stem normalises, applies ReLU and pools in one kernel (here in Pallas's
    interpreter): the same variables, loss, gradients and running statistics as the layers
    one after the other."""
    from jaxflowers.models import maxpool, stem_pool

    model = jf.models.ResNet(stage_sizes=(1,), block_cls=jf.models.BottleneckBlock,
                             num_classes=5, num_filters=16, dtype=dtype)
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 40, 36, 3))  # stem output 20 x 18
    labels = jnp.arange(4) % 5
    variables = model.init(jax.random.PRNGKey(0), x, train=False)

    def step(variables):
        def loss(params):
            logits, updates = model.apply({**variables, "params": params}, x,
                                          mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), \
                updates
        return jax.value_and_grad(loss, has_aux=True)(variables["params"])

    calls = []
    kernel = stem_pool.apply_and_pool
    monkeypatch.setattr(stem_pool, "apply_and_pool",
                        lambda *a, **k: calls.append(1) or kernel(*a, **k))
    (plain_loss, plain_stats), plain_grads = step(variables)
    assert calls == []
    monkeypatch.setattr(maxpool, "_on_gpu", lambda: True)
    (loss, stats), grads = step(variables)
    assert calls == [1]
    # The same variables (initialised through the kernel's module too).
    jax.tree.map(np.testing.assert_array_equal, model.init(jax.random.PRNGKey(0), x), variables)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == jnp.float32 else {"rtol": 0, "atol": 0}
    np.testing.assert_allclose(loss, plain_loss, **tol)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **tol), stats, plain_stats)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **tol), grads, plain_grads)
    assert float(jnp.abs(grads["bn_init"]["scale"]).sum()) > 0
    # inference takes the layers' own way
    before = len(calls)
    model.apply(variables, x, train=False)
    assert len(calls) == before


def test_the_stem_pool_module_refuses_to_train_without_its_relu():
    from jaxflowers.models import stem_pool

    module = stem_pool.BatchNormReLUPool(relu=False)
    x = jnp.ones((2, 8, 8, 4))
    variables = module.init(jax.random.PRNGKey(0), x, use_running_average=True)
    with pytest.raises(ValueError, match="relu must be True"):
        module.apply(variables, x, use_running_average=False, mutable=["batch_stats"])
