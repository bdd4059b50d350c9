"""Mismatches between data, validation data, model and options, refused by ``train``
before anything compiles, each message naming both sides."""
import contextlib

import jax
import numpy as np
import pytest

import jaxflowers as jf


@contextlib.contextmanager
def _compiles():
    """Collects one entry per XLA compilation inside the block."""
    events = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


@pytest.fixture(scope="module")
def sets(digits):
    """Digits split 90/10, per class: (train, test)."""
    return digits.split_each_label(0.9, seed=0)


class _Foreign:
    """Builds a flax module outside jaxflowers.models with ``outputs`` logits."""

    @staticmethod
    def make(outputs):
        import flax.linen as nn

        class Linear(nn.Module):
            @nn.compact
            def __call__(self, x, train=False):
                return nn.Dense(outputs)(x.reshape(x.shape[0], -1))

        return Linear()


def _one_class(train, test):
    return jf.data.ImageSet(train.images[:40], np.zeros(40, int), ("only",)), {}


def _one_class_present(train, test):
    return train.subset(np.flatnonzero(train.labels == 3)), {}


def _reordered_validation(train, test):
    names = tuple(reversed(test.class_names))
    return train, {"validation_data": jf.data.ImageSet(test.images, test.labels, names)}


def _other_validation_classes(train, test):
    names = tuple("abcdefghij")
    return train, {"validation_data": jf.data.ImageSet(test.images, test.labels, names)}


def _smaller_validation_images(train, test):
    small = jf.data.ImageSet(np.zeros((4, 16, 16, 3), np.uint8), np.arange(4), test.class_names)
    return train, {"validation_data": small}


def _validation_uncropped(train, test):
    crop = jf.data.Augmentation(random_crop=(28, 28))
    return train, {"validation_data": test, "augmentation": crop}


MISMATCHES = {
    "model outputs != classes": (
        lambda t, v: (t, {}), lambda: jf.models.cifar_net(1, num_classes=3),
        r"the model has 3 outputs but the training data has 10 classes \('0', '1', .*; "
        r"build the model with num_classes=10"),
    "foreign model outputs != classes (eval_shape)": (
        lambda t, v: (t, {}), lambda: _Foreign.make(4),
        r"the model has 4 outputs but the training data has 10 classes"),
    "one class": (
        _one_class, lambda: jf.models.cifar_net(1, num_classes=1),
        r"the training data has 1 class \('only'\); a classifier needs at least 2"),
    "one class present": (
        _one_class_present, lambda: jf.models.cifar_net(1),
        r"holds images of 1 of its 10 classes \('3'\)"),
    "validation classes in another order": (
        _reordered_validation, lambda: jf.models.cifar_net(1),
        r"validation_data classes \('9', '8', .*\) differ from the training data's "
        r"\('0', '1', .*\): the same names in another order"),
    "validation with other classes": (
        _other_validation_classes, lambda: jf.models.cifar_net(1),
        r"validation_data classes \('a', 'b', .*\) differ .*: it lacks \('0', .*; "
        r"training lacks \('a', "),
    "validation images of another size": (
        _smaller_validation_images, lambda: jf.models.cifar_net(1),
        r"validation_data images are \(16, 16, 3\) but training feeds the network \(32, 32, 3\)"),
    "validation images not cropped like training": (
        _validation_uncropped, lambda: jf.models.cifar_net(1),
        r"validation_data images are \(32, 32, 3\) but training feeds the network \(28, 28, 3\)"),
}


@pytest.mark.parametrize("case", MISMATCHES)
def test_mismatch_is_refused_before_anything_compiles(sets, case):
    make_data, make_model, message = MISMATCHES[case]
    data, options = make_data(*sets)
    model = make_model()
    with _compiles() as compiled, pytest.raises(ValueError, match=message):
        jf.train(data, model, jf.TrainingOptions(mini_batch_size=16, max_epochs=1,
                                                 verbose=False, **options))
    assert compiled == []


def test_jaxflowers_models_declare_the_outputs_eval_shape_finds():
    """The checks trust a jaxflowers model's ``num_classes`` instead of tracing it."""
    from jaxflowers.training.inputs import model_outputs

    for model in (jf.models.cifar_net(2, num_classes=7), jf.models.resnet18(num_classes=5)):
        shape = jax.eval_shape(
            lambda x, m=model: m.init_with_output(jax.random.PRNGKey(0), x, train=False)[0],
            jax.ShapeDtypeStruct((1, 32, 32, 3), np.float32)).shape
        assert model_outputs(model, (32, 32, 3)) == shape[1]


@pytest.mark.parametrize("options, message", [
    (dict(mini_batch_size=18), r"mini_batch_size=18 is not divisible by 4 devices; use a "
                               r"multiple of 4 or scale_for_devices"),
    (dict(mini_batch_size=4096), r"mini_batch_size=4096 is larger than the 1618 training images"),
])
def test_a_batch_that_cannot_be_split_is_refused_before_compiling(sets, options, message):
    with _compiles() as compiled, pytest.raises(ValueError, match=message):
        jf.train(sets[0], jf.models.cifar_net(1), jf.TrainingOptions(verbose=False, **options))
    assert compiled == []


