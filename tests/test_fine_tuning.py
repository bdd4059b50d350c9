"""Fine-tuning a pretrained network (``models.pretrained`` into ``train``): frozen parameters
and frozen batch-norm layers come out bit-identical to the weights loaded, on 1 and 4
devices and both parameter layouts, population pass included; the result saves, loads and
predicts like any network, a sweep job trains one from a model spec, a stopped run resumes
bit for bit, and a trained network trains on with its normalisation."""
import json
import pathlib

import jax
import numpy as np
import pytest

import jaxflowers as jf

WEIGHTS = pathlib.Path(__file__).parent / "fixtures" / "resnet_bottleneck_tiny.safetensors"
TINY = ("resnet", {"stage_sizes": [1, 1, 1, 1], "block": "bottleneck", "num_filters": 8})
LAYOUTS = [jf.ExecutionOptions(num_devices=1, parameter_layout="tree"),
           jf.ExecutionOptions(num_devices=4, parameter_layout="flat"),
           jf.ExecutionOptions(num_devices=4, parameter_layout="tree")]


@pytest.fixture(scope="module")
def loaded():
    return jf.models.pretrained(TINY, 10, weights=WEIGHTS)


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# The population pass works on the tree whatever the layout: run it once, on 4 devices.
@pytest.mark.parametrize("execution,statistics", list(zip(LAYOUTS, ("moving", "moving",
                                                                    "population"))),
                         ids=["1-tree", "4-flat", "4-tree-population"])
def test_frozen_layers_stay_bit_identical_through_training_and_population(digits, loaded,
                                                                          execution, statistics):
    frozen = ("conv_init", "bn_init", "BottleneckBlock_0")
    opts = jf.TrainingOptions(solver="adam", initial_learn_rate=1e-3, mini_batch_size=32,
                              max_epochs=1, verbose=False,
                              batch_normalization_statistics=statistics, learn_rate_factors={
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
               "max_epochs": 1, "verbose": False, "batch_normalization_statistics": "moving",
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


def test_a_fine_tuning_run_resumes_exactly_and_a_trained_net_trains_on(digits, loaded,
                                                                       tmp_path):
    """Stopped after its first epoch (``output_fn``) and resumed from the checkpoint, a
    run with frozen layers ends where the uninterrupted one does, bit for bit; its result
    can itself be trained further, keeping the normalisation it was trained with."""
    data = digits.subset(np.arange(64))
    opts = jf.TrainingOptions(solver="adam", initial_learn_rate=1e-3, mini_batch_size=32,
                              max_epochs=2, shuffle="every-epoch", verbose=False,
                              batch_normalization_statistics="moving",
                              learn_rate_factors={"conv_init": 0.0, "bn_init": 0.0,
                                                  "head": 10.0})
    whole, _ = jf.train(data, loaded, opts)
    stop = lambda message: message.get("iteration") == 2  # noqa: E731 (the first epoch)
    _, info = jf.train(data, loaded, opts.replace(output_fn=stop, checkpoint_path=tmp_path))
    assert info.stopped_by is jf.StopReason.OUTPUT_FN
    resumed, _ = jf.train(data, loaded, opts.replace(checkpoint_path=tmp_path),
                          resume=tmp_path)
    assert _same(resumed.variables, whole.variables)
    again, _ = jf.train(data, whole, opts)  # the programs above, loaded
    assert _same(again.variables["params"]["conv_init"], loaded.variables["params"]["conv_init"])
    np.testing.assert_array_equal(again.normalization[1], loaded.normalization[1])
