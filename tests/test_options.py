"""TrainingOptions validation, the device scaling rule and the learning-rate schedule."""
import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.optim import learn_rate_schedule


@pytest.mark.parametrize("field, value, message", [
    ("solver", "rmsprop", "solver='rmsprop' is not allowed; use one of sgdm, adam"),
    ("shuffle", "sometimes", "shuffle='sometimes'"),
    ("learn_rate_schedule", "cosine", "learn_rate_schedule='cosine'"),
    ("execution_environment", "tpu", "execution_environment='tpu'"),
    ("plots", "yes", "plots='yes'"),
    ("mini_batch_size", 0, "mini_batch_size=0 must be an integer >= 1"),
    ("mini_batch_size", 12.5, "mini_batch_size=12.5"),
    ("max_epochs", True, "max_epochs=True"),
    ("learn_rate_drop_period", -1, "learn_rate_drop_period=-1"),
    ("validation_frequency", 0, "validation_frequency=0"),
    ("verbose_frequency", 0, "verbose_frequency=0"),
    ("seed", -3, "seed=-3"),
    ("initial_learn_rate", 0.0, r"initial_learn_rate=0.0 must be a finite number in \(0, inf\]"),
    ("initial_learn_rate", float("nan"), "initial_learn_rate=nan"),
    ("l2_regularization", -1e-4, "l2_regularization=-0.0001"),
    ("learn_rate_drop_factor", 1.5, r"learn_rate_drop_factor=1.5 must be a finite number in \[0, 1\]"),
    ("momentum", 1.0, r"momentum=1.0 must be a finite number in \[0, 1\)"),
    ("gradient_decay_factor", -0.1, "gradient_decay_factor=-0.1"),
    ("squared_gradient_decay_factor", 2, "squared_gradient_decay_factor=2"),
    ("epsilon", 0, "epsilon=0"),
    ("augmentation", "flip", "augmentation='flip' must be a jaxflowers.data.Augmentation"),
    ("output_fn", 3, "output_fn=3 must be callable"),
    ("plots_path", 3, "plots_path=3 must be a file path or None"),
    ("log_dir", "", "log_dir='' must be a folder path or None"),
    ("validation_data", np.zeros(3), "validation_data=ndarray lacks images, labels, class_names"),
    ("checkpoint_frequency", 0, "checkpoint_frequency=0 must be an integer >= 1"),
    ("checkpoint_frequency_unit", "hour", "checkpoint_frequency_unit='hour'"),
    ("checkpoint_keep", 0, "checkpoint_keep=0"),
    ("checkpoint_path", 3, "checkpoint_path=3 must be a folder path or None"),
])
def test_every_invalid_option_names_value_and_allowed(field, value, message):
    with pytest.raises(ValueError, match=message):
        jf.TrainingOptions(**{field: value})


@pytest.mark.parametrize("field, value, message", [
    ("precision", "float16", "precision='float16'"),
    ("strategy", "pjit", "strategy='pjit'"),
    ("num_devices", 0, "num_devices=0 must be an integer >= 1 or None"),
    ("steps_per_dispatch", 0, "steps_per_dispatch=0"),
    ("data_placement", "disk", "data_placement='disk' is not allowed; use one of auto, "
                               "resident, stream"),
    ("parameter_layout", "vector", "parameter_layout='vector'"),
    ("sync_batch_norm", 1, "sync_batch_norm=1 must be True or False"),
])
def test_every_invalid_execution_option_names_value_and_allowed(field, value, message):
    with pytest.raises(ValueError, match=message):
        jf.ExecutionOptions(**{field: value})


@pytest.mark.parametrize("platform, shape, streamed, expected", [
    ("gpu", (32, 32, 3), False, ("bfloat16", 16, True)),
    ("gpu", (224, 224, 3), False, ("bfloat16", 1, True)),
    ("gpu", (32, 32, 3), True, ("bfloat16", 1, True)),
    ("cpu", (32, 32, 3), False, ("float32", 1, False)),
])
def test_execution_auto_resolves_by_device_and_image_size(platform, shape, streamed, expected):
    assert tuple(jf.ExecutionOptions().resolve(platform, shape, streamed=streamed)) == expected
    chosen = jf.ExecutionOptions(precision="float32", steps_per_dispatch=4,
                                 parameter_layout="tree").resolve(platform, shape, streamed=False)
    assert tuple(chosen) == ("float32", 4, False)


def test_default_learn_rate_follows_matlab_per_solver():
    assert jf.TrainingOptions(solver="sgdm").learn_rate == 0.01
    assert jf.TrainingOptions(solver="adam").learn_rate == 0.001
    assert jf.TrainingOptions(solver="adam", initial_learn_rate=0.5).learn_rate == 0.5


@pytest.mark.parametrize("n", [1, 2, 4])
def test_scale_for_devices_multiplies_batch_and_rate(n, capsys):
    opts = jf.TrainingOptions(solver="adam", initial_learn_rate=1e-3, mini_batch_size=128)
    scaled = jf.scale_for_devices(opts, n)
    assert scaled.mini_batch_size == 128 * n
    assert scaled.learn_rate == pytest.approx(1e-3 * n)
    assert scaled.solver == "adam" and scaled.max_epochs == opts.max_epochs
    out = capsys.readouterr().out
    assert f"{n} device(s): mini_batch_size 128 -> {128 * n}" in out
    assert f"initial_learn_rate 0.001 -> {1e-3 * n:g}" in out


def test_scale_for_devices_counts_devices_and_rejects_bad_counts():
    scaled = jf.scale_for_devices(jf.TrainingOptions(mini_batch_size=8, verbose=False))
    assert scaled.mini_batch_size == 32  # conftest's 4 fake CPU devices
    with pytest.raises(ValueError, match="num_devices=0"):
        jf.scale_for_devices(jf.TrainingOptions(), 0)


def test_piecewise_schedule_drops_at_epoch_boundaries():
    opts = jf.TrainingOptions(initial_learn_rate=0.1, max_epochs=7, learn_rate_schedule="piecewise",
                              learn_rate_drop_factor=0.5, learn_rate_drop_period=3)
    schedule = learn_rate_schedule(opts, steps_per_epoch=4)  # drops after 12 and 24 steps
    rates = np.array([float(schedule(s)) for s in range(28)])
    np.testing.assert_allclose(rates[:12], 0.1, rtol=1e-6)
    np.testing.assert_allclose(rates[12:24], 0.05, rtol=1e-6)
    np.testing.assert_allclose(rates[24:], 0.025, rtol=1e-6)


def test_matlab_example_schedule_80_epochs_drop_every_50():
    opts = jf.TrainingOptions(solver="adam", initial_learn_rate=2e-3, max_epochs=80,
                              learn_rate_schedule="piecewise", learn_rate_drop_period=50)
    schedule = learn_rate_schedule(opts, steps_per_epoch=12)
    assert float(schedule(50 * 12 - 1)) == pytest.approx(2e-3)
    assert float(schedule(50 * 12)) == pytest.approx(2e-4)
    assert float(schedule(80 * 12 - 1)) == pytest.approx(2e-4)


def test_constant_schedule():
    schedule = learn_rate_schedule(jf.TrainingOptions(initial_learn_rate=0.3), steps_per_epoch=5)
    assert float(schedule(0)) == float(schedule(10_000)) == pytest.approx(0.3)
