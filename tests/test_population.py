"""Population batch-norm statistics (MATLAB's BatchNormalizationStatistics="population"):
exact moments of every layer's input over the data, through the public train/predict path."""
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.data.augment import normalize
from jaxflowers.training.population import (
    batch_moments,
    moments_to_statistics,
    population_statistics,
)


@pytest.fixture(scope="module")
def trained():
    """cifar_net(1) after a short SGDM run on the digits: running averages still lag (the
    network as trained: "moving" statistics, the last iteration's)."""
    train_set, validation_set = jf.data.digits().split_each_label(0.8, seed=0)
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, max_epochs=2,
                              shuffle="every-epoch", verbose=False,
                              validation_data=validation_set, validation_frequency=5,
                              batch_normalization_statistics="moving",
                              output_network="last-iteration")
    net, info = jf.train(train_set, jf.models.cifar_net(1), opts)
    return net, info, train_set, validation_set


def _accuracy(net, data):
    return jf.accuracy(jf.scores_to_labels(jf.predict(net, data), net.class_names), data.labels)


def test_one_batch_of_everything_gives_that_batch_s_statistics(trained):
    """With the whole set in one batch the population statistics are the batch statistics
    training mode computes: what flax's running-average update moves towards."""
    net, _, train_set, _ = trained
    finished = population_statistics(net, train_set, mini_batch_size=len(train_set))
    x = normalize(jnp.asarray(train_set.images), *net.normalization, net.dtype)
    _, updates = net.model.apply(net.variables, x, train=True, mutable=["batch_stats"])
    expected = jax.tree.map(lambda new, old: (new - 0.9 * old) / 0.1, updates["batch_stats"],
                            net.variables["batch_stats"])
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5),
                 finished.variables["batch_stats"], expected)
    # Only the statistics change.
    jax.tree.map(np.testing.assert_array_equal, finished.variables["params"],
                 net.variables["params"])


def test_ragged_batches_weigh_every_image_once(trained):
    """The first layer's input does not depend on the batching: its mean and variance over
    ragged batches (100 + ... + a short last one) equal the whole set's, exactly."""
    net, _, train_set, _ = trained
    assert len(train_set) % 100
    finished = population_statistics(net, train_set, mini_batch_size=100)
    first = finished.variables["batch_stats"]["BatchNorm_0"]
    x = normalize(jnp.asarray(train_set.images), *net.normalization, net.dtype)
    conv = net.model.apply(net.variables, x, train=True, mutable=["batch_stats"],
                           capture_intermediates=True)[1]["intermediates"]["Conv_0"]
    out = np.asarray(conv["__call__"][0], np.float64).reshape(-1, first["mean"].shape[0])
    np.testing.assert_allclose(first["mean"], out.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(first["var"], out.var(0), rtol=1e-4, atol=1e-5)


def test_population_statistics_help_a_network_whose_running_averages_lag(trained):
    net, info, train_set, validation_set = trained
    assert _accuracy(net, validation_set) == pytest.approx(info.final_validation_accuracy / 100)
    finished = population_statistics(net, train_set)
    assert _accuracy(finished, validation_set) > _accuracy(net, validation_set) + 0.1


def test_augmented_pass_is_seeded(trained):
    net, _, train_set, _ = trained
    augmentation = jf.data.Augmentation(reflect_x=True, translate_x=(-2, 2), translate_y=(-2, 2))
    runs = [population_statistics(net, train_set, augmentation=augmentation, seed=s)
            .variables["batch_stats"]["BatchNorm_0"]["mean"] for s in (0, 0, 1)]
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])


def test_batch_moments_and_statistics_by_hand():
    model = jf.models.cifar_net(1)
    x = jax.random.normal(jax.random.PRNGKey(0), (6, 32, 32, 3))
    variables = model.init(jax.random.PRNGKey(1), x, train=False)
    moments = batch_moments(model, variables, x)
    assert sorted(moments) == sorted(variables["batch_stats"])
    assert moments["BatchNorm_0"]["moments"].shape == (2, 16)
    stats = moments_to_statistics({"a": {"moments": jnp.array([[1.0, 2.0], [5.0, 3.0]])}})
    np.testing.assert_allclose(stats["a"]["mean"], [1.0, 2.0])
    np.testing.assert_allclose(stats["a"]["var"], [4.0, 0.0])  # 3 - 4 clipped at 0


@pytest.mark.parametrize("change, match", [
    (dict(data=np.zeros((3, 16, 16, 3), np.uint8)), "uint8 images"),
    (dict(data=np.zeros((3, 32, 32, 3), np.float32)), "uint8 images"),
    (dict(data=np.zeros((0, 32, 32, 3), np.uint8)), "n >= 1"),
    (dict(mini_batch_size=0), "mini_batch_size=0"),
    (dict(mini_batch_size=True), "mini_batch_size=True"),
])
def test_bad_input_is_named(trained, change, match):
    net, _, train_set, _ = trained
    kwargs = {"data": train_set, **change}
    data = kwargs.pop("data")
    before = jax.tree.map(np.array, net.variables["batch_stats"])
    with pytest.raises(ValueError, match=match):
        population_statistics(net, data, **kwargs)
    jax.tree.map(np.testing.assert_array_equal, net.variables["batch_stats"], before)


@pytest.mark.parametrize("placement", ["resident", "stream"])
def test_train_s_pass_on_four_devices_equals_one_pass_on_one_device(digits, placement):
    """``train``'s own pass (the default "population"), on 4 devices with the batch split
    over them, from the resident or the streamed set: the statistics of
    ``population_statistics`` on one device over the pass's images (the whole mini-batches,
    in order) with the training augmentation and seed."""
    data = digits.subset(np.arange(100))
    augmentation = jf.data.Augmentation(reflect_x=True, translate_x=(-2, 2))
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, mini_batch_size=16,
                              max_epochs=1, verbose=False, augmentation=augmentation, seed=3)
    net, _ = jf.train(data, jf.models.cifar_net(1), opts,
                      execution=jf.ExecutionOptions(data_placement=placement))
    reference = population_statistics(net, digits.subset(np.arange(96)), mini_batch_size=16,
                                      augmentation=augmentation, seed=3)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5),
                 net.variables["batch_stats"], reference.variables["batch_stats"])
    # The augmentation matters: a pass over the plain images gives other statistics.
    plain = population_statistics(net, digits.subset(np.arange(96)), mini_batch_size=16)
    assert not np.allclose(plain.variables["batch_stats"]["BatchNorm_2"]["var"],
                           net.variables["batch_stats"]["BatchNorm_2"]["var"], rtol=1e-3)


def test_training_starts_before_the_pass_is_compiled_and_its_failure_is_raised(digits,
                                                                               monkeypatch):
    """The pass runs once, after the last iteration: it compiles while the network trains
    (here it cannot finish before the first iteration is reported), and an error in its
    compilation reaches the caller of ``train``."""
    from jaxflowers.training import population

    compile_pass, first_iteration = population.compile_pass, threading.Event()

    def after_the_first_iteration(program):
        assert first_iteration.wait(timeout=120), "training waited for the population pass"
        return compile_pass(program)

    def note(message):
        if message["state"] == "iteration":
            first_iteration.set()
        return False

    data = digits.subset(np.arange(64))
    opts = jf.TrainingOptions(mini_batch_size=16, max_epochs=1, verbose=False, output_fn=note)
    monkeypatch.setattr(population, "compile_pass", after_the_first_iteration)
    net, info = jf.train(data, jf.models.cifar_net(1), opts)
    reference = population_statistics(net, data, mini_batch_size=16)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5),
                 net.variables["batch_stats"], reference.variables["batch_stats"])

    def broken(program):
        raise RuntimeError("no population pass here")

    monkeypatch.setattr(population, "compile_pass", broken)
    with pytest.raises(RuntimeError, match="no population pass here"):
        jf.train(data, jf.models.cifar_net(1), opts)


def test_the_pass_begins_compiling_once_the_first_block_is_dispatched(digits, monkeypatch):
    """Its tracing wants the interpreter: it waits until the set-up is done and the devices
    have work, and the network still gets its population statistics."""
    from jaxflowers.training import feeding, population

    compile_pass, runner = population.compile_pass, feeding.runner
    dispatched, seen = threading.Event(), []

    def counting_runner(*args, **kwargs):
        run = runner(*args, **kwargs)

        def first_noted(*a, **k):
            result = run(*a, **k)
            dispatched.set()
            return result
        return first_noted

    def noting(program):
        seen.append(dispatched.is_set())
        return compile_pass(program)

    monkeypatch.setattr(feeding, "runner", counting_runner)
    monkeypatch.setattr(population, "compile_pass", noting)
    data = digits.subset(np.arange(64))
    net, _ = jf.train(data, jf.models.cifar_net(1),
                      jf.TrainingOptions(mini_batch_size=16, max_epochs=1, verbose=False))
    assert seen == [True]
    reference = population_statistics(net, data, mini_batch_size=16)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5),
                 net.variables["batch_stats"], reference.variables["batch_stats"])


def test_a_network_computing_on_padded_channels_trains_validates_and_passes_as_stored(digits):
    """``cifar_net(2, channel_multiple=8)`` computes on 16/24/48 channels and stores
    11/22/44: training with validation and the population pass keep the stored shapes, and
    the trained network is the one the plain widths give (same seed)."""
    data = digits.subset(np.arange(64))
    opts = jf.TrainingOptions(solver="sgdm", initial_learn_rate=0.05, mini_batch_size=16,
                              max_epochs=1, verbose=False, seed=1,
                              validation_data=digits.subset(np.arange(64, 84)))
    padded, info = jf.train(data, jf.models.cifar_net(2, channel_multiple=8), opts)
    plain, plain_info = jf.train(data, jf.models.cifar_net(2, channel_multiple=1), opts)
    assert padded.variables["batch_stats"]["BatchNorm_0"]["mean"].shape == (11,)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5),
                 padded.variables, plain.variables)
    assert info.final_validation_accuracy == pytest.approx(plain_info.final_validation_accuracy)
