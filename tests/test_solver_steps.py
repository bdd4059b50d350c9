"""One optimizer step through ``train`` against the same step computed by hand with numpy:
MATLAB's gradient thresholds (GradientThreshold, GradientThresholdMethod) and RMSProp, on
1 and 4 devices and with the one-vector parameter layout.

The gradient and the initial weights come from two plain SGD steps of different sizes
(``p1 = p0 - lr g``), so every reference is computed outside the library."""
import jax
import numpy as np
import pytest
from one_step import StepStarts
from one_step import one_step as _step

import jaxflowers as jf


@pytest.fixture(scope="module")
def starts(digits):
    """(data, initial weights p0, gradient g) of one step, per device count."""
    return StepStarts(digits)


def _close(got, want, mask=None):
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6, err_msg=jax.tree_util.keystr(path))


def test_l2norm_clips_each_tensor_alike_on_1_and_4_devices_and_one_vector(starts):
    """MATLAB's default "l2norm": a tensor whose gradient norm exceeds the threshold is
    scaled to it, the others are left alone. Applied to the all-reduced gradient, so one
    device, four, and four with the flat layout take the same step."""
    for execution in (jf.ExecutionOptions(num_devices=1),
                      jf.ExecutionOptions(parameter_layout="flat")):
        data, p0, g = starts(execution)
        norms = {k: np.linalg.norm(v) for k, v in jax.tree_util.tree_leaves_with_path(g)}
        threshold = float(np.median(list(norms.values())))
        assert min(norms.values()) < threshold < max(norms.values())  # some clip, some not
        want = jax.tree.map(
            lambda p, d, t=threshold: p - d * min(1.0, t / np.linalg.norm(d)), p0, g)
        _close(_step(data, 1.0, execution, gradient_threshold=threshold), want)


@pytest.mark.parametrize("method", ["global-l2norm", "absolute-value"])
def test_global_norm_and_absolute_value_thresholds(starts, method):
    data, p0, g = starts()
    flat = np.concatenate([leaf.ravel() for leaf in jax.tree.leaves(g)])
    if method == "global-l2norm":  # the whole gradient scaled to the threshold
        threshold = 0.5 * np.linalg.norm(flat)
        want = jax.tree.map(lambda p, d: p - d * threshold / np.linalg.norm(flat), p0, g)
    else:  # every element clipped to [-threshold, threshold], its sign kept
        threshold = float(np.median(np.abs(flat)))
        want = jax.tree.map(lambda p, d: p - np.clip(d, -threshold, threshold), p0, g)
    got = _step(data, 1.0, jf.ExecutionOptions(parameter_layout="flat"),
                gradient_threshold=float(threshold), gradient_threshold_method=method)
    _close(got, want)


def test_rmsprop_first_step_is_matlab_s_formula(starts):
    """MATLAB's RMSProp: v = beta2 v + (1 - beta2) g^2 (beta2 = 0.9, v starting at 0),
    w -= rate g / (sqrt(v) + epsilon). Compared where the gradient is above the rounding
    noise of its recovery (conv biases feeding batch norm have a zero gradient)."""
    data, p0, g = starts()
    rate = 1e-3
    got = _step(data, rate, solver="rmsprop")
    for a, p, d in zip(jax.tree.leaves(got), jax.tree.leaves(p0), jax.tree.leaves(g)):
        want = p - rate * d / (np.sqrt(0.1 * d * d) + 1e-8)
        real = np.abs(d) > 1e-4
        np.testing.assert_allclose(a[real], want[real], rtol=1e-4, atol=1e-6)
    assert sum(int((np.abs(d) > 1e-4).sum()) for d in jax.tree.leaves(g)) > 1000
