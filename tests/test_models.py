"""Models: parameter counts against torchvision and the MATLAB architecture, shapes, dtypes."""
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxflowers as jf


def _params(model, shape):
    variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros(shape),
                                                  train=False))
    return variables


def _count(tree):
    return sum(x.size for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("num_classes, expected", [(1000, 25_557_032), (5, 23_518_277)])
def test_resnet50_parameter_count_equals_torchvision(num_classes, expected):
    variables = _params(jf.models.resnet50(num_classes), (1, 224, 224, 3))
    assert _count(variables["params"]) == expected


def test_resnet_family_counts_equal_torchvision():
    # torchvision.models.resnet18/34/101(num_classes=1000) parameter counts.
    for build, expected in [(jf.models.resnet18, 11_689_512), (jf.models.resnet34, 21_797_672),
                            (jf.models.resnet101, 44_549_160)]:
        assert _count(_params(build(1000), (1, 224, 224, 3))["params"]) == expected


def _cifar_count_by_hand(depth):
    width = {1: 16, 2: 11, 3: 9, 4: 8}[depth]  # round(16/sqrt(depth))
    total, channels = 0, 3
    for filters in (width, 2 * width, 4 * width):
        for _ in range(depth):
            total += 3 * 3 * channels * filters + filters  # conv weights + bias
            total += 2 * filters  # batch-norm scale + offset
            channels = filters
    return total + channels * 10 + 10  # dense


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_cifar_net_structure_and_count(depth):
    model = jf.models.cifar_net(depth)
    variables = _params(model, (2, 32, 32, 3))
    assert _count(variables["params"]) == _cifar_count_by_hand(depth)
    width = jf.models.cifar_width(depth)
    convs = [variables["params"][f"Conv_{i}"]["kernel"].shape for i in range(3 * depth)]
    assert f"Conv_{3 * depth}" not in variables["params"]
    assert len(convs) == 3 * depth
    assert [c[-1] for c in convs] == [width] * depth + [2 * width] * depth + [4 * width] * depth
    assert all(c[:2] == (3, 3) for c in convs)
    assert len([k for k in variables["batch_stats"]]) == 3 * depth
    assert variables["params"]["Dense_0"]["kernel"].shape == (4 * width, 10)


def test_cifar_net_rejects_bad_depth():
    with pytest.raises(ValueError, match="depth=0"):
        jf.models.cifar_net(0)


def test_bfloat16_compute_keeps_float32_parameters_and_logits():
    model = jf.models.cifar_net(1, dtype=jnp.bfloat16)
    x = jnp.ones((2, 32, 32, 3))
    variables = model.init(jax.random.PRNGKey(0), x, train=False)
    assert {p.dtype for p in jax.tree.leaves(variables["params"])} == {jnp.dtype(jnp.float32)}
    assert model.apply(variables, x, train=False).dtype == jnp.float32
    jaxpr = jax.make_jaxpr(lambda v: model.apply(v, x, train=False))(variables)
    assert "bf16" in str(jaxpr)  # the convolutions really run in bfloat16


def _counting(init):
    calls = []

    def counted(key, shape, dtype=jnp.float32):
        calls.append(shape)
        return init(key, shape, dtype)
    return counted, calls


@pytest.mark.parametrize("ours, flax_cls, kwargs", [
    (jf.models.layers.Conv, nn.Conv, dict(features=4, kernel_size=(3, 3), strides=(2, 2))),
    (jf.models.layers.Dense, nn.Dense, dict(features=5)),
])
def test_layers_equal_flax_and_apply_never_calls_the_initialiser(ours, flax_cls, kwargs):
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 9, 9, 3))
    key = jax.random.PRNGKey(0)
    init, calls = _counting(nn.initializers.lecun_normal())
    mine = ours(kernel_init=init, **kwargs)
    variables = mine.init(key, x)
    reference = flax_cls(**kwargs).init(key, x)
    # Same names, shapes and initial values (the same params key sequence) as flax's layer.
    assert jax.tree.structure(variables) == jax.tree.structure(reference)
    for a, b in zip(jax.tree.leaves(variables), jax.tree.leaves(reference)):
        np.testing.assert_array_equal(a, b)
    assert len(calls) == 1
    np.testing.assert_array_equal(mine.apply(variables, x), flax_cls(**kwargs).apply(variables, x))
    jax.jit(mine.apply)(variables, x)
    assert len(calls) == 1  # flax's layer traces its initialiser on every apply


def test_a_stored_parameter_of_the_wrong_shape_is_named():
    x = jnp.ones((1, 8, 8, 3))
    variables = jf.models.layers.Conv(4, (3, 3)).init(jax.random.PRNGKey(0), x)
    with pytest.raises(flax.errors.ScopeParamShapeError, match=r"kernel.*\(3, 3, 3, 5\).*"
                       r"\(3, 3, 3, 4\)"):
        jf.models.layers.Conv(5, (3, 3)).apply(variables, x)
    variables = jf.models.resnet18(5).init(jax.random.PRNGKey(0), jnp.ones((1, 32, 32, 3)),
                                          train=False)
    with pytest.raises(flax.errors.ScopeParamShapeError, match='"kernel" in "/conv_init"'):
        jf.models.resnet18(5, num_filters=32).apply(variables, jnp.ones((1, 32, 32, 3)),
                                                    train=False)


def test_cifar_net_dense_layer_starts_as_matlab_fully_connected_layer():
    """MATLAB's fullyConnectedLayer: Glorot-uniform weights, zero biases."""
    x = jnp.zeros((1, 32, 32, 3))
    dense = jf.models.cifar_net(1).init(jax.random.PRNGKey(0), x, train=False)["params"]["Dense_0"]
    fan_in, fan_out = dense["kernel"].shape
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    assert np.abs(dense["kernel"]).max() <= limit
    assert np.std(dense["kernel"]) == pytest.approx(limit / np.sqrt(3), rel=0.15)
    np.testing.assert_array_equal(dense["bias"], 0)
    lecun = jf.models.cifar_net(1, dense_init="lecun_normal").init(
        jax.random.PRNGKey(0), x, train=False)["params"]["Dense_0"]["kernel"]
    assert np.std(lecun) < np.std(dense["kernel"])  # 1/sqrt(64) against sqrt(2/74)


@pytest.mark.parametrize("bad", ["glorot", 3, None])
def test_cifar_net_rejects_an_unknown_dense_initialiser(bad):
    with pytest.raises(ValueError, match="dense_init"):
        jf.models.cifar_net(1, dense_init=bad)


def test_cifar_net_travels_through_the_sweep_codec():
    """A sweep job returns its TrainedNet as JSON: every module field must be plain data."""
    from jaxflowers.sweep import transfer

    model = jf.models.cifar_net(2, dense_init="lecun_normal")
    arrays = {}
    encoded = transfer.encode_tree(model, arrays, what="model")
    back = transfer.rebuild(transfer.decode_tree(encoded, arrays.__getitem__))
    assert back == model


class _PlainCifarNet(nn.Module):
    """cifar_net from flax's own layers: autodiff through nn.BatchNorm, relu, max_pool."""

    depth: int

    @nn.compact
    def __call__(self, x, train=True):
        width = jf.models.cifar_width(self.depth)
        for block, filters in enumerate((width, 2 * width, 4 * width)):
            for _ in range(self.depth):
                x = nn.Conv(filters, (3, 3), padding="SAME")(x)
                x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9,
                                         epsilon=1e-5)(x))
            if block < 2:
                x = nn.max_pool(x, (2, 2), (2, 2))
        return nn.Dense(10)(nn.avg_pool(x, (8, 8), (8, 8)).reshape(x.shape[0], -1))


@pytest.mark.parametrize("depth, multiple", [(1, 1), (2, 1), (2, 8)])
def test_cifar_net_gradients_equal_autodiff_of_plain_flax_layers(depth, multiple):
    """The hand-written batch-norm and max-pool backward passes, in the whole network: same
    loss, parameter and input gradients and running statistics as flax's autodiff; also when
    the convolutions compute on channels padded to a multiple of 8 (depth 2: 11/22/44 stored,
    16/24/48 computed), whose stored variables are the plain network's."""
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 32, 32, 3))
    labels = jax.random.randint(jax.random.PRNGKey(2), (16,), 0, 10)
    ours = jf.models.cifar_net(depth, channel_multiple=multiple)
    variables = ours.init(jax.random.PRNGKey(0), x, train=False)
    assert (jax.tree.map(jnp.shape, variables)
            == jax.tree.map(jnp.shape, _PlainCifarNet(depth).init(jax.random.PRNGKey(0), x)))

    def loss(model):
        def fn(params, x):
            logits, updates = model.apply({"params": params,
                                           "batch_stats": variables["batch_stats"]},
                                          x, train=True, mutable=["batch_stats"])
            labels_1hot = jax.nn.one_hot(labels, 10)
            return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels_1hot, -1)), updates
        # Compiled: dispatching the backward pass op by op on the CPU takes 10x longer.
        return jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(
            variables["params"], x)

    (value, stats), grads = loss(ours)
    (ref_value, ref_stats), ref_grads = loss(_PlainCifarNet(depth))
    assert float(value) == pytest.approx(float(ref_value), rel=1e-6)
    for path, got in jax.tree_util.tree_leaves_with_path((grads, stats)):
        want = np.asarray(_at(path, (ref_grads, ref_stats)))
        if "Conv" in jax.tree_util.keystr(path) and "bias" in jax.tree_util.keystr(path):
            # A bias feeding batch norm has a true gradient of 0: both are rounding noise.
            assert np.abs(got).max() < 1e-6 and np.abs(want).max() < 1e-6
            continue
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("multiple", [1, 8])
def test_cifar_net_folds_nonzero_convolution_biases_into_batch_norm(multiple):
    """The convolutions' biases reach only batch norm's means: with nonzero biases (a fine-tuned
    or imported network) the outputs in training and inference and the running statistics
    are flax's conv + bias + batch norm, and the biases' gradients are exactly zero."""
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 32, 32, 3))
    ours = jf.models.cifar_net(2, channel_multiple=multiple)
    variables = ours.init(jax.random.PRNGKey(0), x, train=False)
    leaves = jax.tree_util.tree_leaves_with_path(variables["params"])
    biases = {jax.tree_util.keystr(p): 0.5 * jax.random.normal(jax.random.PRNGKey(i), v.shape)
              for i, (p, v) in enumerate(leaves) if "Conv" in jax.tree_util.keystr(p)
              and "bias" in jax.tree_util.keystr(p)}
    assert len(biases) == 6
    params = jax.tree_util.tree_map_with_path(
        lambda p, v: biases.get(jax.tree_util.keystr(p), v), variables["params"])

    def run(model):
        def fn(params):
            logits, updates = model.apply({"params": params,
                                           "batch_stats": variables["batch_stats"]},
                                          x, train=True, mutable=["batch_stats"])
            return jnp.sum(logits), (logits, updates)
        (_, (logits, updates)), grads = jax.jit(jax.value_and_grad(fn, has_aux=True))(params)
        evaluated = jax.jit(lambda p, s: model.apply({"params": p, "batch_stats": s}, x,
                                                     train=False))(params, updates["batch_stats"])
        return logits, updates, evaluated, grads

    logits, stats, evaluated, grads = run(ours)
    ref_logits, ref_stats, ref_evaluated, _ = run(_PlainCifarNet(2))
    for got, want in ((logits, ref_logits), (evaluated, ref_evaluated), (stats, ref_stats)):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(b).max())
    assert not np.abs(stats["batch_stats"]["BatchNorm_0"]["mean"]).max() < 0.1  # the biases
    for path, grad in jax.tree_util.tree_leaves_with_path(grads):
        if jax.tree_util.keystr(path) in biases:
            assert not np.any(grad), jax.tree_util.keystr(path)


@pytest.mark.parametrize("bad", [0, -8, 2.0, True, "8"])
def test_cifar_net_rejects_a_bad_channel_multiple(bad):
    with pytest.raises(ValueError, match="channel_multiple"):
        jf.models.cifar_net(3, channel_multiple=bad)


def _at(path, tree):
    for key in path:
        tree = tree[getattr(key, "key", getattr(key, "idx", None))]
    return tree
