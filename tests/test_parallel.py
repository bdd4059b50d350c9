"""1 device vs 4 devices: same numbers (the data-parallel contract), for both strategies."""
import functools

import jax
import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.parallel import REPLICATED, DataParallel, sharded
from jaxflowers.training.optimizer import Solver, hyperparameters
from jaxflowers.training.step import StepConfig, init_state, train_block


def _data(n=24):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(n) % 3
    return jf.data.ImageSet(images, labels, ("a", "b", "c"))


def _tiny_resnet():
    # A two-stage bottleneck ResNet: batch norm, projections, no biases before batch norm.
    # (A conv bias feeding batch norm has a true gradient of zero; Adam divides its ~1e-9
    # rounding noise by ~1e-9 and moves it by +-lr, different noise on 1 and 4 devices.)
    return jf.models.ResNet(stage_sizes=(1, 1), block_cls=jf.models.BottleneckBlock,
                            num_classes=3, num_filters=4)


def _train(solver, num_devices, strategy, sync=True):
    # 24 images, global batch 8, one epoch: exactly 3 optimizer steps.
    opts = jf.TrainingOptions(
        solver=solver, initial_learn_rate=0.05, mini_batch_size=8, max_epochs=1,
        shuffle="every-epoch", verbose=False, seed=3,
        augmentation=jf.data.Augmentation(reflect_x=True, translate_x=(-3, 3),
                                           translate_y=(-3, 3)))
    execution = jf.ExecutionOptions(num_devices=num_devices, strategy=strategy,
                                    sync_batch_norm=sync)
    net, info = jf.train(_data(), _tiny_resnet(), opts, execution=execution)
    assert len(info.loss) == 3
    return net, info


def _assert_close(tree_a, tree_b, rtol=1e-5, atol=1e-9):
    """Leaf-wise ||a - b|| <= rtol ||b|| + atol.

    ``atol`` is for leaves that barely left zero: a batch-norm bias feeding a convolution
    and another batch norm has a gradient that nearly cancels (its constant shift is
    normalised away), so after 3 steps it is ~1e-6 with ~1e-5 relative rounding noise
    from the order of the sums (2.4e-11 absolute); a real error is ~1e-3 absolute."""
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(tree_a), jax.tree.leaves(tree_b)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.linalg.norm(a - b) <= rtol * np.linalg.norm(b) + atol, \
            jax.tree_util.keystr(path)


@pytest.fixture(scope="module", params=["sgdm", "adam"])
def reference(request):
    return request.param, _train(request.param, 1, "shard_map")


@pytest.mark.parametrize("strategy", ["shard_map", "pmap"])
def test_four_devices_equal_one_device_with_sync_batch_norm(reference, strategy):
    solver, (net1, info1) = reference
    net4, info4 = _train(solver, 4, strategy)
    _assert_close(net4.variables["params"], net1.variables["params"])
    _assert_close(net4.variables["batch_stats"], net1.variables["batch_stats"])
    np.testing.assert_allclose(info4.loss, info1.loss, rtol=1e-5)
    np.testing.assert_allclose(info4.accuracy, info1.accuracy)
    # and the steps really moved the parameters (a trivial pass would also "match")
    init = _tiny_resnet().init(jax.random.PRNGKey(0), np.zeros((1, 32, 32, 3)), train=False)
    moved = np.linalg.norm(net1.variables["params"]["head"]["kernel"] -
                           init["params"]["head"]["kernel"])
    assert moved > 1e-3


def _replicas(x, parallel):
    if parallel.strategy == "pmap":
        return [np.asarray(r) for r in np.asarray(x)]
    return [np.asarray(s.data) for s in x.addressable_shards]


@pytest.mark.parametrize("strategy", ["shard_map", "pmap"])
def test_without_sync_the_replicas_stay_identical(strategy):
    parallel = DataParallel(jax.devices()[:4], strategy)
    data = _data()
    opts = jf.TrainingOptions(solver="adam", mini_batch_size=8, max_epochs=1)
    model = jf.models.cifar_net(1, num_classes=3)
    cfg = StepConfig(model=model, solver=Solver(opts, 3),
                     augmentation=jf.data.Augmentation(reflect_x=True), dtype=np.float32,
                     sync_batch_norm=False)
    state = parallel.put(init_state(model, cfg.solver()[0], (32, 32, 3), seed=0))
    order = np.arange(24, dtype=np.int32).reshape(3, 8)
    block = parallel.wrap(functools.partial(train_block, cfg=cfg, length=1),
                          (REPLICATED,) * 3 + (sharded(1),) + (REPLICATED,) * 4,
                          (REPLICATED, REPLICATED))
    args = [parallel.put(x) for x in (data.images, data.labels)]
    args += [parallel.put(order, sharded(1)), parallel.put(np.int32(0)),
             parallel.put((np.full(3, 120, np.float32), np.full(3, 60, np.float32))),
             parallel.put(hyperparameters(opts)), parallel.put(np.int32(3))]
    for _ in range(3):
        state, _ = block(state, *args)
    for leaf in jax.tree.leaves((state.params, state.batch_stats, state.opt_state)):
        copies = _replicas(leaf, parallel)
        assert len(copies) == 4
        for other in copies[1:]:
            np.testing.assert_array_equal(other, copies[0])
    assert int(np.asarray(parallel.get(state.step))) == 3
