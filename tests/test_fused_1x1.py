"""Batch norm folded into ResNet's 1x1 convolutions (``ResNet(fused_1x1=True)``): the same
variables, losses, gradients and running statistics as the plain network, with the kernels
really in the program (here in Pallas's interpreter), on one device and four."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.models import fused_1x1
from jaxflowers.models.resnet import resnet

X = jax.random.normal(jax.random.PRNGKey(1), (8, 32, 32, 3))
LABELS = jnp.arange(8) % 5


def _net(fused, dtype=jnp.float32, **kwargs):
    return resnet((1, 1), "bottleneck", 5, num_filters=16, dtype=dtype, fused_1x1=fused,
                  **kwargs)


def _loss_grads_stats(model, variables, x):
    def loss(params):
        logits, updates = model.apply({"params": params,
                                       "batch_stats": variables["batch_stats"]},
                                      x, train=True, mutable=["batch_stats"])
        picked = jax.nn.log_softmax(logits)[jnp.arange(x.shape[0]), LABELS[:x.shape[0]]]
        return -jnp.mean(picked), updates["batch_stats"]
    (value, stats), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
        variables["params"])
    return value, grads, stats


def _kernels_in_program(model, variables, x) -> int:
    def loss(params):
        return model.apply({"params": params, "batch_stats": variables["batch_stats"]}, x,
                           train=True, mutable=["batch_stats"])[0].sum()
    return str(jax.make_jaxpr(jax.grad(loss))(variables["params"])).count("pallas_call")


def _assert_close(found, expected, rtol):
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(found),
                            jax.tree.leaves(expected)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= rtol * np.abs(b).max() + 1e-7, jax.tree_util.keystr(path)


@pytest.mark.parametrize("dtype, rtol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_fused_network_equals_the_plain_one(dtype, rtol):
    plain, fused = _net(False, dtype), _net(True, dtype)
    variables = plain.init(jax.random.PRNGKey(0), X[:1], train=False)
    # the same variables, drawn the same: either network takes the other's weights
    assert jax.tree.all(jax.tree.map(np.array_equal, variables,
                                     fused.init(jax.random.PRNGKey(0), X[:1], train=False)))
    # two kernels per block (the reducing 1x1 with sums, the expanding one with the apply)
    assert _kernels_in_program(fused, variables, X) == 4
    assert _kernels_in_program(plain, variables, X) == 0
    found = _loss_grads_stats(fused, variables, X)
    expected = _loss_grads_stats(plain, variables, X)
    _assert_close(found, expected, rtol)
    assert np.abs(np.asarray(found[1]["head"]["kernel"], np.float32)).max() > 1e-3
    # inference takes the plain path: identical
    np.testing.assert_array_equal(fused.apply(variables, X, train=False),
                                  plain.apply(variables, X, train=False))


def test_shapes_no_tile_fits_take_the_plain_path():
    """3 images of 24 px: 108 and 27 rows, which no tile of 16 or more divides."""
    x = X[:3, :24, :24]
    plain, fused = _net(False), _net(True)
    variables = plain.init(jax.random.PRNGKey(0), x[:1], train=False)
    assert _kernels_in_program(fused, variables, x) == 0
    _assert_close(_loss_grads_stats(fused, variables, x),
                  _loss_grads_stats(plain, variables, x), 1e-5)


def test_tiles_follow_the_shapes_and_say_when_none_fits():
    assert fused_1x1.tiles(401408, 256, 64) == (64, 64, 64, 4, 4)
    assert fused_1x1.tiles(401408, 64, 256) == (128, 64, 64, 4, 3)
    assert fused_1x1.tiles(6272, 512, 2048) == fused_1x1.CONFIG
    assert fused_1x1.tiles(64 * 49, 2048, 512)[0] == 64  # 64 images of 7x7
    assert not fused_1x1.fits(108, 64, 64) and not fused_1x1.fits(128, 8, 64)
    with pytest.raises(ValueError, match=r"\(108, 64\) @ \(64, 64\)"):
        fused_1x1.product(jnp.zeros((108, 64)), jnp.zeros((64, 64)))


def test_fused_1x1_needs_bottleneck_blocks():
    net = resnet((1, 1), "basic", 5, num_filters=16, fused_1x1=True)
    with pytest.raises(ValueError, match="bottleneck"):
        net.init(jax.random.PRNGKey(0), X[:1], train=False)


def _train(fused):
    rng = np.random.default_rng(0)
    data = jf.data.ImageSet(rng.integers(0, 256, (24, 32, 32, 3), dtype=np.uint8),
                            np.arange(24) % 3, ("a", "b", "c"))
    opts = jf.TrainingOptions(solver="adam", initial_learn_rate=0.01, mini_batch_size=8,
                              max_epochs=1, shuffle="every-epoch", verbose=False, seed=3)
    model = jf.models.ResNet(stage_sizes=(1, 1), block_cls=jf.models.BottleneckBlock,
                             num_classes=3, num_filters=16, fused_1x1=fused)
    return jf.train(data, model, opts, execution=jf.ExecutionOptions(num_devices=4))


def test_training_on_four_devices_with_synchronised_batch_norm_equals_the_plain_network():
    """Through ``train``: statistics pooled over the devices, input gradients from the
    global sums, in the fused kernels' forward and the backward."""
    (net, info), (ref_net, ref_info) = _train(True), _train(False)
    np.testing.assert_allclose(info.loss, ref_info.loss, rtol=1e-5)
    _assert_close(net.variables, ref_net.variables, 1e-4)
    assert not np.allclose(net.variables["batch_stats"]["BottleneckBlock_0"]["BatchNorm_1"]
                           ["mean"], 0)


def test_resnet50_training_step_lowers_to_triton_for_cuda(monkeypatch):
    """Without a GPU: Triton's lowering rejects what the interpreter accepts (tile shapes,
    slicing of loaded blocks), so every fused kernel of ResNet-50 at 224 px is lowered."""
    monkeypatch.setattr(fused_1x1, "_interpret", lambda: False)
    model = jf.models.resnet50(5, dtype=jnp.bfloat16, fused_1x1=True)
    variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                                  jnp.zeros((1, 224, 224, 3)), train=False))

    def loss(params, batch_stats, x):
        return model.apply({"params": params, "batch_stats": batch_stats}, x, train=True,
                           mutable=["batch_stats"])[0].sum()
    x = jax.ShapeDtypeStruct((2, 224, 224, 3), jnp.float32)  # the last stage: 98 rows, plain
    text = jax.jit(jax.grad(loss)).trace(variables["params"], variables["batch_stats"],
                                         x).lower(lowering_platforms=("cuda",)).as_text()
    assert "bn_relu_1x1" in text and "product_1x1" in text and "xla.gpu.triton" in text
