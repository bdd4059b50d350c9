"""Fine-tuning through ``TrainingOptions.learn_rate_factors`` (MATLAB's ``setLearnRateFactor``,
``freezeNetwork``): each factor scales its parameters' solver step, checked against numpy
on 1 and 4 devices and both parameter layouts; frozen parameters and frozen batch-norm
layers come out bit-identical to the weights loaded; the fine-tuned network saves, loads
and predicts like any other, and a sweep job trains one from a model spec."""
import json
import pathlib

import jax
import numpy as np
import pytest

import jaxflowers as jf

N = 48  # one mini-batch of 48: exactly one step
WEIGHTS = pathlib.Path(__file__).parent / "fixtures" / "resnet_bottleneck_tiny.safetensors"
TINY = ("resnet", {"stage_sizes": [1, 1, 1, 1], "block": "bottleneck", "num_filters": 8})
LAYOUTS = [jf.ExecutionOptions(num_devices=1, parameter_layout="tree"),
           jf.ExecutionOptions(num_devices=4, parameter_layout="flat")]


def _step(data, rate, execution=None, **options):
    execution = execution or jf.ExecutionOptions()
    opts = jf.TrainingOptions(**{"solver": "sgdm", "momentum": 0, **options},
                              l2_regularization=0, initial_learn_rate=rate, mini_batch_size=N,
                              max_epochs=1, verbose=False,
                              batch_normalization_statistics="moving")
    net, info = jf.train(data, jf.models.cifar_net(1), opts,
                         execution=execution.replace(sync_batch_norm=True))
    assert len(info.loss) == 1
    return jax.tree.map(lambda x: np.asarray(x, np.float64), net.variables["params"])


@pytest.fixture(scope="module")
def start(digits):
    """(data, initial weights p0, gradient g) of one step, from two plain SGD steps."""
    data = digits.subset(np.random.default_rng(2).permutation(len(digits))[:N])
    one, two = _step(data, 1.0), _step(data, 2.0)
    return (data, jax.tree.map(lambda a, b: 2 * a - b, one, two),
            jax.tree.map(lambda a, b: a - b, one, two))


# Later patterns win: everything at 2, the second convolution at 0.5, the dense layer's
# bias at 10, the first convolution frozen (a convolution: the forward pass is unchanged).
FACTORS = {"*": 2.0, "Conv_1": 0.5, "Dense_0/bias": 10.0, "Conv_0": 0.0}


def _factor(path: str) -> float:
    return {"Conv_1": 0.5, "Dense_0/bias": 10.0, "Conv_0": 0.0}.get(
        path if path.startswith("Dense_0") else path.split("/")[0], 2.0)


def _expect(p0, step):
    return {k: {leaf: p0[k][leaf] - _factor(f"{k}/{leaf}") * step(k, leaf) for leaf in p0[k]}
            for k in p0}


@pytest.mark.parametrize("execution", LAYOUTS, ids=["1-tree", "4-flat"])
def test_sgd_step_is_rate_times_factor_times_gradient(start, execution):
    data, p0, g = start
    got = _step(data, 1.0, execution, learn_rate_factors=FACTORS)
    want = _expect(p0, lambda k, leaf: g[k][leaf])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6), got, want)


def test_adam_step_is_scaled_by_the_factor_on_the_flat_layout(start):
    """Adam's first step is ``rate * g / (|g| + eps)``; the factor multiplies it."""
    data, p0, g = start
    rate, eps = 1e-3, 1e-8
    got = _step(data, rate, LAYOUTS[1], solver="adam", learn_rate_factors=FACTORS)
    want = _expect(p0, lambda k, leaf: rate * g[k][leaf] / (np.abs(g[k][leaf]) + eps))
    for k in p0:
        for leaf in p0[k]:
            big = np.abs(g[k][leaf]) > 1e-4  # where the recovered gradient is above noise
            np.testing.assert_allclose(got[k][leaf][big], want[k][leaf][big], rtol=1e-3,
                                       atol=1e-7, err_msg=f"{k}/{leaf}")


@pytest.fixture(scope="module")
def loaded():
    return jf.models.pretrained(TINY, 10, weights=WEIGHTS)


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("execution", [*LAYOUTS, jf.ExecutionOptions(num_devices=4,
                                                                     parameter_layout="tree")],
                         ids=["1-tree", "4-flat", "4-tree"])
def test_frozen_layers_stay_bit_identical_through_training_and_population(digits, loaded,
                                                                          execution):
    frozen = ("conv_init", "bn_init", "BottleneckBlock_0")
    opts = jf.TrainingOptions(solver="adam", initial_learn_rate=1e-3, mini_batch_size=32,
                              max_epochs=1, verbose=False, learn_rate_factors={
                                  **{name: 0.0 for name in frozen}, "head": 10.0})
    net, _ = jf.train(digits.subset(np.arange(96)), loaded, opts, execution=execution)
    for collection in ("params", "batch_stats"):
        ours, theirs = net.variables[collection], loaded.variables[collection]
        for name in frozen:
            if name in theirs:
                assert _same(ours[name], theirs[name]), (collection, name)
        assert not _same(ours["BottleneckBlock_3"], theirs["BottleneckBlock_3"])
    # The pretrained network's normalisation, not the digits' statistics.
    np.testing.assert_array_equal(net.normalization[0], loaded.normalization[0])


def test_fine_tuned_network_saves_loads_predicts_and_a_sweep_job_trains_one(digits, tmp_path):
    train, test = digits.split_each_label(0.5, seed=0)
    options = {"solver": "adam", "initial_learn_rate": 1e-3, "mini_batch_size": 32,
               "max_epochs": 1, "verbose": False,
               "learn_rate_factors": {"*": 0.0, "BottleneckBlock_3": 1.0, "head": 10.0}}
    options = json.loads(json.dumps(jf.TrainingOptions(**options).to_dict()))  # as a job's
    model = (TINY[0], {**TINY[1], "weights": str(WEIGHTS)})
    net, info = jf.sweep.train_job(data=train.subset(np.arange(128)), model=model,
                                   options=options)
    assert info.stopped_by is jf.StopReason.MAX_EPOCHS
    loaded = jf.load(net.save(tmp_path / "tuned.safetensors"))
    np.testing.assert_array_equal(jf.predict(loaded, test.images[:20]),
                                  jf.predict(net, test.images[:20]))
    np.testing.assert_allclose(loaded.normalization[1], [58.395, 57.12, 57.375], rtol=1e-6)


def test_options_check_and_carry_the_factors():
    opts = jf.TrainingOptions(learn_rate_factors={"*": 0, "head": 10})
    assert opts.learn_rate_factors == (("*", 0.0), ("head", 10.0))
    back = jf.TrainingOptions.from_dict(json.loads(json.dumps(opts.to_dict())))
    assert back.learn_rate_factors == opts.learn_rate_factors
    for bad in ({"head": -1}, {"": 1.0}, {"head": float("nan")}, "head"):
        with pytest.raises(ValueError, match="learn_rate_factors=.* must map parameter"):
            jf.TrainingOptions(learn_rate_factors=bad)


def test_a_pattern_that_matches_nothing_is_refused_naming_the_layers(digits):
    opts = jf.TrainingOptions(mini_batch_size=32, max_epochs=1, verbose=False,
                              learn_rate_factors={"layer1*": 0.0})
    with pytest.raises(ValueError, match=r"'layer1\*' matches no parameter; the network's "
                                         r"layers are BatchNorm_0, BatchNorm_1, BatchNorm_2, "
                                         r"Conv_0"):
        jf.train(digits.subset(np.arange(64)), jf.models.cifar_net(1), opts)


def test_a_fine_tuning_run_resumes_exactly_and_a_trained_net_trains_on(digits, loaded,
                                                                       tmp_path):
    """Stopped after its first epoch (``output_fn``) and resumed from the checkpoint, a
    run with frozen layers ends where the uninterrupted one does, bit for bit; its result
    can itself be trained further, keeping the normalisation it was trained with."""
    data = digits.subset(np.arange(64))
    opts = jf.TrainingOptions(solver="adam", initial_learn_rate=1e-3, mini_batch_size=32,
                              max_epochs=2, shuffle="every-epoch", verbose=False,
                              learn_rate_factors={"conv_init": 0.0, "bn_init": 0.0,
                                                  "head": 10.0})
    whole, _ = jf.train(data, loaded, opts)
    stop = lambda message: message.get("iteration") == 2  # noqa: E731 (the first epoch)
    _, info = jf.train(data, loaded, opts.replace(output_fn=stop, checkpoint_path=tmp_path))
    assert info.stopped_by is jf.StopReason.OUTPUT_FN
    resumed, _ = jf.train(data, loaded, opts.replace(checkpoint_path=tmp_path),
                          resume=tmp_path)
    assert _same(resumed.variables, whole.variables)
    again, _ = jf.train(data, whole, opts.replace(max_epochs=1))
    assert _same(again.variables["params"]["conv_init"], loaded.variables["params"]["conv_init"])
    np.testing.assert_array_equal(again.normalization[1], loaded.normalization[1])
