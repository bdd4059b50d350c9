"""The hand-written fast paths equal the straightforward versions: batch norm (+ ReLU)
against flax.linen.BatchNorm, flat parameters against the per-leaf tree, the space-to-depth
stem against the plain 7x7 stride-2 convolution, a block of iterations against as many single
ones, the step's cross-entropy against optax's (the max pool's: test_pooling.py)."""
import functools

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
from jaxflowers.models.stem import StemConv
from jaxflowers.parallel import REPLICATED, DataParallel, sharded
from jaxflowers.training.layout import FlatParams
from jaxflowers.training.optimizer import Solver, hyperparameters
from jaxflowers.training.step import StepConfig, cross_entropy, init_state, train_block

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


@pytest.mark.parametrize("train", [True, False])
def test_an_offset_normalises_the_input_plus_it(train):
    """``offset=b`` (a folded convolution bias) is batch norm of ``x + b``: outputs, the
    parameters' and the input's gradients, running statistics; the offset gets no gradient."""
    offset = jnp.linspace(-3.0, 2.0, 6)

    def loss(apply_offset):
        def fn(params, x, b):
            kwargs = {"offset": b} if apply_offset else {}
            y, updates = BatchNorm(use_running_average=not train, relu=True).apply(
                {"params": params, "batch_stats": STATS}, x if apply_offset else x + b,
                mutable=["batch_stats"], **kwargs)
            return jnp.sum(y * W), updates["batch_stats"]
        return jax.value_and_grad(fn, argnums=(0, 1, 2), has_aux=True)(PARAMS, X, offset)

    (value, stats), grads = loss(True)
    (ref_value, ref_stats), ref_grads = loss(False)
    _assert_close((value, stats, grads[:2]), (ref_value, ref_stats, ref_grads[:2]), 1e-5)
    if train:  # batch statistics cancel b, and the running ones take no gradient
        assert not np.any(grads[2]) and np.abs(ref_grads[2]).max() < 1e-4
    else:  # the stored statistics do not: b's gradient is that of x + b
        _assert_close(grads[2], ref_grads[2], 1e-5)
        assert np.abs(grads[2]).max() > 1


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


def test_flat_params_round_trip_a_tree_in_order():
    tree = {"a": jnp.arange(6.0).reshape(2, 3), "b": {"c": jnp.arange(4.0) + 10, "d": jnp.ones(())}}
    flat = FlatParams.of(jax.eval_shape(lambda: tree))
    vector = flat.ravel(tree)
    assert vector.shape == (11,) and flat.offsets == (0, 6, 10, 11)
    np.testing.assert_array_equal(vector[6:10], [10, 11, 12, 13])
    for back in (flat.unravel(vector), flat.unravel(np.asarray(vector))):  # jax or numpy
        jax.tree.map(np.testing.assert_array_equal, back, tree)


def test_flat_params_store_convolution_kernels_output_channels_first():
    """The vector holds an HWIO kernel as OHWI (the filter gradient's own order); unravel
    gives the tree back, with a device axis in front too."""
    kernel = jnp.arange(2 * 3 * 4 * 5.0).reshape(2, 3, 4, 5)  # H, W, I, O
    tree = {"conv": {"kernel": kernel}, "bias": jnp.arange(5.0)}
    flat = FlatParams.of(jax.eval_shape(lambda: tree))
    vector = flat.ravel(tree)
    # Leaves in tree order ("bias" first), the kernel's first 24 elements output channel 0.
    np.testing.assert_array_equal(vector[5:29], np.asarray(kernel)[..., 0].ravel())
    np.testing.assert_array_equal(flat.ravel(tree, np), vector)
    for back in (flat.unravel(vector), flat.unravel(np.asarray(vector))):
        jax.tree.map(np.testing.assert_array_equal, back, tree)
    stacked = flat.unravel(jnp.stack([vector, vector + 1]))  # pmap's leading device axis
    np.testing.assert_array_equal(stacked["conv"]["kernel"][1], kernel + 1)


@pytest.mark.parametrize("strategy", ["shard_map", "pmap"])
@pytest.mark.parametrize("solver", ["adam", "sgdm"])
def test_flat_parameters_train_like_the_tree_on_4_devices(solver, strategy):
    """GPUs keep parameters, gradient and solver state as one vector each (one all-reduce,
    one update); 3 steps on 4 devices must equal the per-leaf tree's."""
    parallel = DataParallel(jax.devices()[:4], strategy)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (24, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, 24).astype(np.int32)
    # Adam divides each gradient element by its own running magnitude, so an element whose
    # gradient is rounding noise (~1e-9, e.g. behind a near-constant batch-norm channel of
    # this 4-filter net) moves by +-lr on the noise's sign, whichever layout computed it.
    # An epsilon of 1e-4 leaves real gradients normalised and noise unamplified.
    opts = jf.TrainingOptions(solver=solver, initial_learn_rate=0.05, mini_batch_size=8,
                              max_epochs=1, l2_regularization=1e-3, epsilon=1e-4)
    # Bias-free before batch norm (a conv bias feeding batch norm has a true gradient of
    # zero, which Adam turns from rounding noise into +-lr steps; tests/test_parallel.py).
    model = jf.models.ResNet(stage_sizes=(1, 1), block_cls=jf.models.BottleneckBlock,
                             num_classes=3, num_filters=4)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)),
                                               train=False))
    results = []
    for flat in (None, FlatParams.of(shapes["params"])):
        cfg = StepConfig(model=model, solver=Solver(opts, 3),
                         augmentation=jf.data.Augmentation(reflect_x=True), dtype=np.float32,
                         sync_batch_norm=False, flat=flat)
        state = parallel.put(init_state(model, cfg.solver()[0], (32, 32, 3), seed=0, flat=flat))
        block = parallel.wrap(functools.partial(train_block, cfg=cfg, length=1),
                              (REPLICATED,) * 3 + (sharded(1),) + (REPLICATED,) * 4,
                              (REPLICATED, REPLICATED))
        args = [parallel.put(x) for x in (images, labels)]
        args += [parallel.put(np.arange(24, dtype=np.int32).reshape(3, 8), sharded(1)),
                 parallel.put(np.int32(0)),
                 parallel.put((np.full(3, 120, np.float32), np.full(3, 60, np.float32))),
                 parallel.put(hyperparameters(opts)), parallel.put(np.int32(3))]
        for _ in range(3):
            state, _ = block(state, *args)
        results.append(parallel.get(cfg.variables(state)))
    assert jax.tree.structure(results[0]) == jax.tree.structure(results[1])
    # Same arithmetic per element, but XLA may sum a weight gradient in another order
    # when its consumer is the concatenation (~1e-7 relative). Adam turns such a rounding
    # difference in a small gradient into up to ~1e-4 of its learning rate per step (seen:
    # 1.2e-6 with jax 0.12); SGDM passes it on unamplified.
    atol = 1e-4 * opts.learn_rate if solver == "adam" else 1e-6
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=atol), *results)
    initial = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)), train=False)
    assert not np.allclose(results[1]["params"]["head"]["kernel"],
                           initial["params"]["head"]["kernel"])


@pytest.mark.parametrize("size", [(16, 16), (15, 18), (224, 224)])
def test_space_to_depth_stem_equals_the_7x7_stride_2_convolution(size):
    x = jax.random.normal(jax.random.PRNGKey(1), (2, *size, 3))
    plain = nn.Conv(8, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], use_bias=False)
    variables = plain.init(jax.random.PRNGKey(0), x)
    ours = StemConv(8)
    # Same parameter: name, shape and initial values.
    jax.tree.map(np.testing.assert_array_equal, ours.init(jax.random.PRNGKey(0), x), variables)
    expected, got = plain.apply(variables, x), ours.apply(variables, x)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    grad = [jax.grad(lambda v, m=m: jnp.sum(m.apply(v, x) * jnp.cos(m.apply(v, x))))(variables)
            for m in (plain, ours)]
    expected_grad = np.asarray(grad[0]["params"]["kernel"])
    # Each kernel gradient sums 2 x H/2 x W/2 products in another order: float32 rounding
    # relative to the largest entry (224 x 224 on jax 0.12: 2e-4 where entries reach 244).
    np.testing.assert_allclose(grad[1]["params"]["kernel"], expected_grad, rtol=1e-4,
                               atol=1e-5 * np.abs(expected_grad).max())


def test_resnet_stems_compute_the_same_network():
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 64, 64, 3))
    model = jf.models.resnet18(5)
    variables = model.init(jax.random.PRNGKey(0), x, train=False)
    conv = model.clone(stem="conv")
    jax.tree.map(np.testing.assert_array_equal, conv.init(jax.random.PRNGKey(0), x, train=False),
                 variables)
    np.testing.assert_allclose(model.apply(variables, x, train=False),
                               conv.apply(variables, x, train=False), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="stem='s2d'"):
        model.clone(stem="s2d").init(jax.random.PRNGKey(0), x, train=False)


@pytest.mark.parametrize("strategy", ["shard_map", "pmap"])
def test_a_block_of_iterations_trains_like_as_many_single_ones(strategy):
    """Several iterations per dispatch (as on GPUs) draw every iteration's augmentation before
    their loop and stop at the limit: the same images, updates and metrics as one iteration
    per dispatch, zeros for the iterations past the limit, on 2 devices."""
    parallel = DataParallel(jax.devices()[:2], strategy)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 4, 40).astype(np.int32)
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, mini_batch_size=8,
                              max_epochs=1)
    model = jf.models.cifar_net(1, num_classes=4, width=4)
    augmentation = jf.data.Augmentation(reflect_x=True, reflect_y=True, translate_x=(-3, 3),
                                        translate_y=(-2, 2))
    cfg = StepConfig(model=model, solver=Solver(opts, 5), augmentation=augmentation,
                     dtype=np.float32, sync_batch_norm=False)
    order = rng.permutation(40).astype(np.int32).reshape(5, 8)
    args = [parallel.put(images), parallel.put(labels), parallel.put(order, sharded(1)),
            parallel.put(np.int32(0)),
            parallel.put((np.full(3, 120, np.float32), np.full(3, 60, np.float32))),
            parallel.put(hyperparameters(opts))]
    specs = (REPLICATED,) * 3 + (sharded(1),) + (REPLICATED,) * 4
    runs = []
    for length, calls in ((1, 4), (3, 2)):  # iterations 0-3, the limit 4
        block = parallel.wrap(functools.partial(train_block, cfg=cfg, length=length), specs,
                              (REPLICATED, REPLICATED))
        state = parallel.put(init_state(model, cfg.solver()[0], (32, 32, 3), seed=3))
        metrics = []
        for _ in range(calls):
            state, out = block(state, *args, parallel.put(np.int32(4)))
            metrics.append(parallel.get(out))
        runs.append((parallel.get(cfg.variables(state)), int(parallel.get(state.step)),
                     {k: np.concatenate([m[k] for m in metrics]) for k in metrics[0]}))
    (single, single_steps, single_metrics), (blocked, blocked_steps, blocked_metrics) = runs
    assert single_steps == blocked_steps == 4
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
                 single, blocked)
    for name in ("loss", "accuracy", "learn_rate", "finite"):
        np.testing.assert_allclose(blocked_metrics[name][:4], single_metrics[name], rtol=1e-5)
        assert blocked_metrics[name][4:].tolist() == [0.0, 0.0]  # past the limit
    assert single_metrics["finite"].tolist() == [1.0] * 4


def test_a_blocks_loop_holds_no_branch_random_bits_scatter_or_checked_gather():
    """What makes a GPU iteration launch few kernels, read from the block's program: its loop
    body has no branch (whose operands XLA copies every iteration), draws no random bits (the
    augmentation's choices are drawn once, before the loop), scatters nothing, and gathers
    only with indices known to be in range."""
    from jax.extend import core

    parallel = DataParallel(jax.devices()[:1])
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, mini_batch_size=8,
                              max_epochs=1)
    model = jf.models.cifar_net(1, num_classes=4, width=4)
    cfg = StepConfig(model=model, solver=Solver(opts, 5),
                     augmentation=jf.data.Augmentation(reflect_x=True, translate_x=(-3, 3)),
                     dtype=np.float32, sync_batch_norm=False)
    block = parallel.wrap(functools.partial(train_block, cfg=cfg, length=4),
                          (REPLICATED,) * 3 + (sharded(1),) + (REPLICATED,) * 4,
                          (REPLICATED, REPLICATED))
    program = block.trace(init_state(model, cfg.solver()[0], (32, 32, 3), seed=0),
                          np.zeros((40, 32, 32, 3), np.uint8), np.zeros(40, np.int32),
                          np.zeros((5, 8), np.int32), np.int32(0),
                          (np.zeros(3, np.float32), np.ones(3, np.float32)),
                          hyperparameters(opts), np.int32(4)).jaxpr

    def equations(jaxpr, in_loop=False):
        for eqn in jaxpr.eqns:
            yield eqn, in_loop
            loop = in_loop or eqn.primitive.name in ("while", "scan")
            for param in eqn.params.values():
                for sub in param if isinstance(param, (tuple, list)) else [param]:
                    sub = sub.jaxpr if isinstance(sub, core.ClosedJaxpr) else sub
                    if isinstance(sub, core.Jaxpr):
                        yield from equations(sub, loop)

    found = list(equations(program.jaxpr))
    in_loop = [eqn for eqn, inside in found if inside]
    names = {eqn.primitive.name for eqn in in_loop}
    assert "conv_general_dilated" in names  # the loop trains
    assert not {"cond", "scatter", "scatter-add"} & names
    assert not [name for name in names if name.startswith(("random_", "threefry"))]
    assert any(eqn.primitive.name == "random_bits" for eqn, inside in found if not inside)
    gathers = [eqn for eqn in in_loop if eqn.primitive.name == "gather"]
    assert gathers and all(eqn.params["mode"] == jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS
                           for eqn in gathers)


def test_the_steps_cross_entropy_equals_optax_in_value_and_gradient():
    logits = jax.random.normal(jax.random.PRNGKey(0), (16, 10)) * 30  # large: the max matters
    labels = jax.random.randint(jax.random.PRNGKey(1), (16,), 0, 10)
    reference = optax.softmax_cross_entropy_with_integer_labels
    np.testing.assert_allclose(cross_entropy(logits, labels), reference(logits, labels),
                               rtol=1e-6)
    ours = jax.grad(lambda z: cross_entropy(z, labels).mean())(logits)
    theirs = jax.grad(lambda z: reference(z, labels).mean())(logits)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-9)
