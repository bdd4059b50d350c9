"""Validation patience and the best-validation network through ``train`` (MATLAB's
ValidationPatience, OutputNetwork): the stop against the rule run by hand, the returned
network against its own scores, results read late, and a resumed run."""
import importlib
import math

import numpy as np
import pytest

import jaxflowers as jf


@pytest.fixture(scope="module")
def data(digits):
    keep = np.random.default_rng(0).permutation(len(digits))[:130]
    return digits.subset(keep[:100]), digits.subset(keep[100:])


def _options(val, **changes):
    # Adam at 3e-3 on 100 digits: the validation loss (every 3 iterations) improves for a
    # few validations, then worsens, and patience 2 stops the run within 3 epochs.
    opts = jf.TrainingOptions(solver="adam", initial_learn_rate=0.003, mini_batch_size=16,
                              max_epochs=6, shuffle="every-epoch", verbose=False,
                              validation_data=val, validation_frequency=3,
                              validation_patience=2, batch_normalization_statistics="moving")
    return opts.replace(**changes)


def _by_hand(losses, patience):
    """MATLAB's rule: stop once the loss has been >= the smallest so far ``patience``
    validations in a row. Returns (index of the stopping validation or None, best index)."""
    best, best_index, waited = math.inf, None, 0
    for i, loss in enumerate(losses):
        if loss < best:
            best, best_index, waited = loss, i, 0
        else:
            waited += 1
        if waited >= patience:
            return i, best_index
    return None, best_index


def _loss_and_accuracy(net, val):
    scores = np.asarray(jf.predict(net, val), np.float64)
    loss = -np.mean(np.log(scores[np.arange(len(val)), val.labels]))
    return loss, 100 * np.mean(np.argmax(scores, 1) == val.labels)


@pytest.fixture(scope="module")
def stopped(data, tmp_path_factory):
    train, val = data
    path = tmp_path_factory.mktemp("patience")
    net, info = jf.train(train, jf.models.cifar_net(1), _options(val, checkpoint_path=str(path)))
    return net, info, path


def test_patience_stops_where_the_rule_by_hand_does_and_returns_the_best_network(stopped, data):
    net, info, _ = stopped
    _, val = data
    stop, best = _by_hand(info.validation_loss, 2)
    assert stop == len(info.validation_loss) - 1 and best < stop  # it got worse, then stopped
    assert info.stopped_early and info.stop_reason == "met validation criterion"
    assert info.iteration[-1] == info.validation_iteration[-1] < 36  # history ends at the stop
    assert info.output_network_iteration == info.validation_iteration[best]
    # The returned network is the best one: its scores reproduce the best validation.
    loss, accuracy = _loss_and_accuracy(net, val)
    assert loss == pytest.approx(info.validation_loss[best], rel=1e-5)
    assert accuracy == pytest.approx(info.validation_accuracy[best])
    assert info.final_validation_loss == pytest.approx(info.validation_loss[best], rel=1e-9)


def test_a_stop_read_one_sync_point_late_ends_at_the_same_validation(stopped, data, monkeypatch):
    """As on GPUs: the host reads each validation while the devices run on (one device
    here, two iterations per dispatch; test_train says why). The run still ends at the
    validation the rule picks, records nothing after it, and "last-iteration" returns the
    network of that validation, not the one the devices had reached."""
    monkeypatch.setattr(importlib.import_module("jaxflowers.training.run"), "_look_ahead",
                        lambda *_: 1)
    train, val = data
    net, info = jf.train(train, jf.models.cifar_net(1),
                         _options(val, output_network="last-iteration"),
                         execution=jf.ExecutionOptions(num_devices=1, steps_per_dispatch=2))
    stop, _ = _by_hand(info.validation_loss, 2)
    assert stop == len(info.validation_loss) - 1 and info.stop_reason == "met validation criterion"
    assert len(info.loss) == info.validation_iteration[-1] < 36
    assert info.output_network_iteration == info.validation_iteration[-1]
    loss, _ = _loss_and_accuracy(net, val)
    assert loss == pytest.approx(info.validation_loss[-1], rel=1e-5)


def test_a_resumed_run_keeps_its_best_network_and_patience(stopped, data):
    """Resumed from the checkpoint after two epochs (12 iterations: the best validation so
    far and one worse one behind it, both restored), the run stops where the uninterrupted
    one did and returns the same network."""
    net, info, path = stopped
    train, val = data
    assert info.output_network_iteration < 12 < info.iteration[-1]
    resumed_net, resumed = jf.train(train, jf.models.cifar_net(1),
                                    _options(val, checkpoint_path=str(path)),
                                    resume=path / "iteration_12")
    assert resumed.stop_reason == info.stop_reason
    assert resumed.output_network_iteration == info.output_network_iteration < 12
    np.testing.assert_array_equal(resumed.validation_loss, info.validation_loss)
    for a, b in zip(jf_leaves(resumed_net.variables), jf_leaves(net.variables)):
        np.testing.assert_array_equal(a, b)


def jf_leaves(tree):
    import jax

    return jax.tree.leaves(tree)
