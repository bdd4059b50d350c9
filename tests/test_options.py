"""TrainingOptions validation, the device scaling rule and the learning-rate schedule."""

import jax
import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.training.optimizer import learn_rate_schedule


@pytest.mark.parametrize("field, value, message", [
    ("solver", "lbfgs", "solver='lbfgs' is not allowed; use one of sgdm, rmsprop, adam"),
    ("shuffle", "sometimes", "shuffle='sometimes'"),
    ("learn_rate_schedule", "linear", "learn_rate_schedule='linear'.*use one of none, "
                                      "piecewise, warmup, cosine, polynomial, exponential"),
    ("learn_rate_schedule", (), r"learn_rate_schedule=\(\) is empty"),
    ("learn_rate_schedule", ("warmup", 0.1), r"0.1 is not allowed"),
    ("learn_rate_schedule", ("cosine", "warmup"), "'cosine' runs to the end of training, so "
                                                  "what follows it would never run"),
    ("gradient_threshold", 0, "gradient_threshold=0 must be a positive number or math.inf"),
    ("gradient_threshold", float("nan"), "gradient_threshold=nan"),
    ("gradient_threshold_method", "l1norm", "gradient_threshold_method='l1norm' is not "
                                            "allowed; use one of l2norm, global-l2norm, "
                                            "absolute-value"),
    ("validation_patience", 0, "validation_patience=0 must be a positive integer or math.inf"),
    ("validation_patience", 2.5, "validation_patience=2.5"),
    ("output_network", "best", "output_network='best' is not allowed; use one of auto, "
                               "last-iteration, best-validation"),
    ("output_network", "best-validation", "output_network='best-validation' needs "
                                          "validation_data"),
    ("metrics", ("accuracy", "f1"), r"metrics=\('accuracy', 'f1'\) must be distinct names "
                                    "among accuracy, fscore, precision, recall, auc"),
    ("metrics", ("auc", "auc"), "metrics=.* must be distinct"),
    ("objective_metric_name", "fscore", "objective_metric_name='fscore' is not allowed; use "
                                        "one of loss, accuracy"),
    ("batch_normalization_statistics", "global", "batch_normalization_statistics='global' "
                                                 "is not allowed; use one of population, moving"),
    ("squared_gradient_decay_factor", 1.0, "squared_gradient_decay_factor=1.0"),
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
    ("learn_rate_drop_factor", 1.5,
     r"learn_rate_drop_factor=1.5 must be a finite number in \[0, 1\]"),
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
    devices = "1 device" if n == 1 else f"{n} devices"
    assert f"{devices}: mini_batch_size 128 -> {128 * n}" in out
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


def test_piecewise_drops_are_one_program_for_any_number_of_epochs():
    """The drops are computed, not listed up to the last epoch: the schedule's program is the
    same for 7 or 700 epochs; its values are those of one drop at a time (optax's piecewise
    schedule) exactly up to three drops, within 3 units in the last place of the exact power
    after, and 0 once the power underflows."""
    def schedule(epochs, drop=0.3):
        opts = jf.TrainingOptions(initial_learn_rate=1.0, max_epochs=epochs,
                                  learn_rate_schedule="piecewise", learn_rate_drop_factor=drop,
                                  learn_rate_drop_period=1)
        return learn_rate_schedule(opts, steps_per_epoch=2)

    assert str(jax.make_jaxpr(schedule(7))(0)) == str(jax.make_jaxpr(schedule(700))(0))
    steps = np.arange(0, 400, dtype=np.int32)
    drops = steps // 2
    rates = np.asarray(jax.vmap(schedule(7))(steps))
    one_at_a_time = np.cumprod(np.r_[np.float32(1), np.full(199, np.float32(0.3))],
                               dtype=np.float32)[drops]
    np.testing.assert_array_equal(rates[drops <= 3], one_at_a_time[drops <= 3])
    exact = np.float64(np.float32(0.3)) ** drops
    normal = exact >= np.finfo(np.float32).tiny
    np.testing.assert_array_max_ulp(rates[normal], exact[normal].astype(np.float32), maxulp=3)
    assert rates[-1] == 0 and np.all(np.diff(rates) <= 0)
    assert float(schedule(7, drop=1.0)(10**6)) == 1.0
    assert float(schedule(7, drop=0.0)(1)) == 1.0 and float(schedule(7, drop=0.0)(2)) == 0.0


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


def test_squared_gradient_decay_defaults_follow_matlab_per_solver():
    assert jf.TrainingOptions(solver="rmsprop").squared_decay == 0.9
    assert jf.TrainingOptions(solver="adam").squared_decay == 0.999
    options = jf.TrainingOptions(solver="rmsprop", squared_gradient_decay_factor=0.5)
    assert options.squared_decay == 0.5
    assert jf.TrainingOptions(solver="rmsprop").learn_rate == 0.001


def test_validation_options_need_validation_data_and_metrics_take_one_name(digits):
    with pytest.raises(ValueError, match="validation_patience=3 needs validation_data"):
        jf.TrainingOptions(validation_patience=3)
    opts = jf.TrainingOptions(metrics="fscore", objective_metric_name="fscore",
                              validation_data=digits)
    assert opts.metrics == ("fscore",) and opts.best_validation
    assert not jf.TrainingOptions().best_validation  # "auto" without validation data
    assert not opts.replace(output_network="last-iteration").best_validation


@pytest.mark.parametrize("make, message", [
    (lambda: jf.schedules.Warmup(num_steps=0), "num_steps=0 must be an integer >= 1"),
    (lambda: jf.schedules.Warmup(frequency_unit="batch"), "frequency_unit='batch'"),
    (lambda: jf.schedules.Cosine(initial_factor=0), "initial_factor=0"),
    (lambda: jf.schedules.Cosine(period_growth_factor=0.5), "period_growth_factor=0.5"),
    (lambda: jf.schedules.Polynomial(power=-1), "power=-1"),
    (lambda: jf.schedules.Exponential(drop_factor=1), "drop_factor=1 must be a finite number "
                                                      r"in \(0, 1\)"),
    (lambda: jf.schedules.Cyclical(step_ratio=1.5), "step_ratio=1.5"),
    (lambda: jf.schedules.Piecewise(period=0), "period=0"),
])
def test_bad_schedule_parameters_name_field_and_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def _rates(schedule, steps_per_epoch=4, max_epochs=5, rate=0.1):
    opts = jf.TrainingOptions(initial_learn_rate=rate, max_epochs=max_epochs,
                              learn_rate_schedule=schedule)
    fn = learn_rate_schedule(opts, steps_per_epoch)
    return np.array([float(fn(s)) for s in range(steps_per_epoch * max_epochs)])


def test_each_schedule_equals_its_formula():
    """MATLAB's schedules with their defaults; k counts the schedule's completed steps
    (epochs unless the schedule says iterations), so epoch schedules hold for an epoch."""
    k = np.arange(20) // 4  # completed epochs at each of 20 iterations
    np.testing.assert_allclose(_rates("cosine"), 0.1 * 0.5 * (1 + np.cos(np.pi * k / 5)),
                               rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(_rates("polynomial"), 0.1 * (1 - k / 5), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(_rates("exponential"), 0.1 * 0.1 ** k, rtol=1e-5)
    # cyclical: period 10 epochs, rising over 2.5 of them to 5x, falling over 7.5
    up = np.interp(k % 10, [0, 2.5, 10], [1, 5, 1])
    np.testing.assert_allclose(_rates("cyclical"), 0.1 * up, rtol=1e-5)
    warm = _rates("warmup")  # 5 iterations from 0 to the full rate, then the full rate
    np.testing.assert_allclose(warm, 0.1 * np.minimum(np.arange(20) / 5, 1), rtol=1e-5)


def test_a_sequence_runs_each_schedule_from_where_the_last_ended():
    """MATLAB's cell array {warmupLearnRate(...), cosineLearnRate(...)}: the cosine's k
    starts at 0 when the warm-up ends, and "rest of training" means the rest."""
    chain = (jf.schedules.Warmup(num_steps=2, frequency_unit="epoch"),
             jf.schedules.Cosine(final_factor=0.1, frequency_unit="iteration"))
    rates = _rates(chain, steps_per_epoch=4, max_epochs=5)
    np.testing.assert_allclose(rates[:8], 0.1 * np.repeat([0.0, 0.5], 4), atol=1e-8)
    k = np.arange(12)  # 12 iterations left after the two warm-up epochs
    np.testing.assert_allclose(rates[8:], 0.1 * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * k / 12))),
                               rtol=1e-5)
    restarts = _rates(jf.schedules.Cosine(period=2, period_growth_factor=2), max_epochs=6)
    k = np.arange(24) // 4
    position = np.select([k < 2, k < 6], [k / 2, (k - 2) / 4], (k - 6) / 8)
    np.testing.assert_allclose(restarts, 0.1 * 0.5 * (1 + np.cos(np.pi * position)),
                               rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("options, message", [
    (dict(mini_batch_size=0), r"mini_batch_size=0 must be an integer >= 1"),
    (dict(solver="adamw"), r"solver='adamw' is not allowed; use one of sgdm, rmsprop, adam"),
    (dict(initial_learn_rate=float("nan")), r"initial_learn_rate=nan must be a finite number"),
    (dict(validation_data=[1, 2]), r"validation_data=list lacks images, labels, class_names"),
])
def test_a_bad_option_names_field_value_and_what_is_allowed(options, message):
    with pytest.raises(ValueError, match=message):
        jf.TrainingOptions(**options)
