"""``TrainingOptions.learn_rate_factors`` (MATLAB's ``setLearnRateFactor``, ``freezeNetwork``):
each factor scales its parameters' solver step, checked against numpy on 1 and 4 devices
and both parameter layouts; frozen parameters take no weight decay; the options check and
carry the factors. Fine-tuning pretrained networks: ``test_fine_tuning.py``."""
import json

import jax
import numpy as np
import pytest
from one_step import StepStarts
from one_step import one_step as _step

import jaxflowers as jf

LAYOUTS = [jf.ExecutionOptions(num_devices=1, parameter_layout="tree"),
           jf.ExecutionOptions(num_devices=4, parameter_layout="flat")]


@pytest.fixture(scope="module")
def starts(digits):
    """(data, initial weights p0, gradient g) of one step, per device count."""
    return StepStarts(digits)


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
def test_sgd_step_is_rate_times_factor_times_gradient(starts, execution):
    data, p0, g = starts(execution)
    got = _step(data, 1.0, execution, learn_rate_factors=FACTORS)
    want = _expect(p0, lambda k, leaf: g[k][leaf])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6), got, want)


def test_adam_step_is_scaled_by_the_factor_on_the_flat_layout(starts):
    """Adam's first step is ``rate * g / (|g| + eps)``; the factor multiplies it."""
    data, p0, g = starts(LAYOUTS[1])
    rate, eps = 1e-3, 1e-8
    got = _step(data, rate, LAYOUTS[1], solver="adam", learn_rate_factors=FACTORS)
    want = _expect(p0, lambda k, leaf: rate * g[k][leaf] / (np.abs(g[k][leaf]) + eps))
    for k in p0:
        for leaf in p0[k]:
            big = np.abs(g[k][leaf]) > 1e-4  # where the recovered gradient is above noise
            np.testing.assert_allclose(got[k][leaf][big], want[k][leaf][big], rtol=1e-3,
                                       atol=1e-7, err_msg=f"{k}/{leaf}")


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


def test_frozen_parameters_take_no_weight_decay_into_a_global_gradient_norm(starts):
    """L2 then "global-l2norm" clipping: the norm is that of the trainable parameters'
    gradients plus their decay; the frozen ones add nothing and do not move."""
    data, p0, g = starts(LAYOUTS[1])
    l2, frozen = 0.5, ("Conv_0", "Conv_1")
    total = {k: {leaf: 0 * g[k][leaf] if k in frozen else g[k][leaf] + l2 * p0[k][leaf]
                 for leaf in g[k]} for k in g}
    norm = np.sqrt(sum(np.sum(np.square(v)) for v in jax.tree.leaves(total)))
    threshold = 0.5 * norm
    want = jax.tree.map(lambda p, d: p - d * threshold / norm, p0, total)
    got = _step(data, 1.0, LAYOUTS[1], l2_regularization=l2, gradient_threshold=threshold,
                gradient_threshold_method="global-l2norm",
                learn_rate_factors={name: 0.0 for name in frozen})
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6), got, want)
