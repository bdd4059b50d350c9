"""The recipe registry: MATLAB's two examples verbatim, the tuned variant, models and data by
name, and the Flowers example's validation schedule on real photos."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers import recipes
from jaxflowers.training.optimizer import learn_rate_schedule


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_flowers_recipe_is_the_multi_gpu_example_verbatim(gpus):
    """miniBatchSize = 128*numGPUs, initialLearnRate = 1e-2*miniBatchSize/64,
    ValidationFrequency = floor(4*numel(imdsTrain.Files)/miniBatchSize), Adam, 80 epochs,
    x0.1 every 50, reflection and +-30 px translation."""
    opts = recipes.recipe("flowers").options(gpus, 3303, seed=3)
    batch = 128 * gpus
    assert (opts.mini_batch_size, opts.seed) == (batch, 3)
    assert opts.initial_learn_rate == pytest.approx(1e-2 * batch / 64)  # 0.04 on 2 GPUs
    assert opts.validation_frequency == math.floor(4 * 3303 / batch)  # 51 on 2 GPUs
    assert (opts.solver, opts.max_epochs, opts.shuffle) == ("adam", 80, "every-epoch")
    assert (opts.learn_rate_schedule, opts.learn_rate_drop_factor,
            opts.learn_rate_drop_period) == ("piecewise", 0.1, 50)
    assert opts.augmentation == jf.data.Augmentation(reflect_x=True, translate_x=(-30, 30),
                                                     translate_y=(-30, 30))
    assert recipes.recipe("flowers").train_fraction == 0.9


def test_tuned_flowers_recipe_changes_only_the_rate_and_the_validation_frequency():
    example = recipes.recipe("flowers").options(2, 3303)
    tuned = recipes.recipe("flowers-tuned").options(2, 3303)
    assert tuned.initial_learn_rate == pytest.approx(2e-3)  # 1e-3 x 2 GPUs
    assert tuned.validation_frequency == 3303 // 256  # once per epoch
    assert tuned.replace(initial_learn_rate=example.initial_learn_rate,
                         validation_frequency=example.validation_frequency) == example


def test_sweep_recipe_is_the_parfeval_example_verbatim():
    opts = recipes.recipe("sweep").options(1, 45000)
    assert (opts.solver, opts.momentum, opts.l2_regularization) == ("sgdm", 0.9, 1e-10)
    assert opts.initial_learn_rate == pytest.approx(0.1 * 128 / 256)
    assert (opts.mini_batch_size, opts.max_epochs, opts.shuffle) == (128, 30, "every-epoch")
    assert opts.validation_frequency == 45000 // 128  # floor(numel(imdsTrain.Labels)/128)
    assert opts.augmentation == jf.data.Augmentation(reflect_x=True, translate_x=(-4, 4),
                                                     translate_y=(-4, 4))
    assert recipes.sweep_options(45000) == opts


def test_batch_size_is_always_the_global_mini_batch():
    """MATLAB's MiniBatchSize: the multi-GPU example's rate follows it (1e-2 x batch / 64);
    without a batch size its own rule, 128 per GPU, applies."""
    flowers = recipes.recipe("flowers")
    chosen = flowers.options(2, 3303, batch_size=64)
    assert chosen.mini_batch_size == 64 and chosen.initial_learn_rate == pytest.approx(1e-2)
    assert flowers.options(2, 3303).mini_batch_size == 256
    with pytest.raises(ValueError, match="batch size 100 is not a multiple of the 8 devices"):
        flowers.options(8, 3303, batch_size=100)
    assert recipes.recipe("digits").options(2, 1600, batch_size=64).mini_batch_size == 64
    assert recipes.recipe("sweep").options(2, 45000, batch_size=256).validation_frequency == \
        45000 // 256


def test_default_recipe_follows_the_data_and_the_model():
    assert recipes.recipe_for("flowers").name == "flowers"
    assert recipes.recipe_for("/some/folder", "resnet50").name == "flowers"
    assert recipes.recipe_for("digits").name == "digits"
    assert recipes.recipe_for("cifar10", "cifar_net").name == "digits"


@pytest.mark.parametrize("name", sorted(recipes.MODELS))
def test_every_model_builds_at_its_image_size(name):
    spec = (name, {"depth": 3}) if name == "cifar_net" else name
    if name == "resnet":
        spec = ("resnet", {"stage_sizes": [1, 1], "block": "basic"})
    model = recipes.build_model(spec, 3)
    assert model.num_classes == 3
    assert recipes.IMAGE_SIZE.get(name, (224, 224)) == (
        (32, 32) if name == "cifar_net" else (224, 224))
    assert recipes.build_model(recipes.model_spec(model), 99) == model  # the spec rebuilds it
    if name == "cifar_net":
        assert model.depth == 3


@pytest.mark.parametrize("name", sorted(recipes.MODELS))
def test_the_model_arguments_are_the_networks_own(name):
    """``MODEL_ARGUMENTS`` (what an experiment may vary without importing the models) names
    fields of each network's module, with the type of their values."""
    import collections.abc
    import dataclasses
    import typing

    spec = ("resnet", {"stage_sizes": [1, 1]}) if name == "resnet" else (name, {})
    module = type(recipes.build_model(spec, 3))
    fields = {f.name: f for f in dataclasses.fields(module)}
    hints = typing.get_type_hints(module)
    for argument, kind in recipes.MODEL_ARGUMENTS[name].items():
        if argument == "block":  # resnet's block is a name of its BLOCKS, stored as the class
            continue
        assert argument in fields, (name, argument)
        allowed = typing.get_args(hints[argument]) or (hints[argument],)
        assert kind in allowed or (kind is list and typing.get_origin(hints[argument]) is
                                   collections.abc.Sequence), (name, argument, hints[argument])


def test_cifar_net_takes_a_width_and_its_spec_keeps_it():
    model = recipes.build_model(("cifar_net", {"depth": 2, "width": 6}), 10)
    assert recipes.model_spec(model) == ("cifar_net", {"depth": 2, "num_classes": 10,
                                                       "width": 6})
    assert "width" not in recipes.model_spec(jf.models.cifar_net(2))[1]  # the example's rule
    with pytest.raises(ValueError, match=r"cifar_net\(width=0\)"):
        jf.models.cifar_net(2, width=0)


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="recipe='matlab'.*flowers, flowers-tuned, sweep"):
        recipes.recipe("matlab")
    with pytest.raises(ValueError, match="model 'vgg'.*resnet50"):
        recipes.build_model("vgg", 5)
    with pytest.raises(recipes.DataUnavailableError, match="'imagenet' is neither a known set"):
        recipes.load_data("imagenet")


def test_flowers_example_validates_on_its_schedule_on_the_sample(shared_data):
    """The 200-photo sample through the Flowers recipe on one device: the example's options
    and validation schedule (every floor(4 x 180 / 128) = 5 iterations, and at the end). A
    small network at 32 x 32 stands in for ResNet-50, which CPUs cannot train here."""
    photos = jf.data.ImageFolder(shared_data / "flowers-sample", image_size=(32, 32))
    recipe = recipes.recipe("flowers")
    train_set, validation_set = photos.split_each_label(recipe.train_fraction, seed=0)
    assert (len(train_set), len(validation_set)) == (180, 20)
    opts = recipe.options(1, len(train_set), validation_data=validation_set, max_epochs=12,
                          verbose=False)
    assert (opts.mini_batch_size, opts.validation_frequency) == (128, 5)
    assert opts.initial_learn_rate == pytest.approx(0.02)
    net, info = jf.train(train_set, jf.models.cifar_net(1, num_classes=5), opts,
                         execution=jf.ExecutionOptions(num_devices=1))
    assert info.validation_iteration.tolist() == [5, 10, 12]  # one step per epoch
    np.testing.assert_allclose(info.learn_rate, 0.02, rtol=1e-6)
    full = recipe.options(1, len(train_set))  # 80 epochs: x0.1 after epoch 50
    schedule = learn_rate_schedule(full, steps_per_epoch=1)
    assert float(schedule(49)) == pytest.approx(0.02)
    assert float(schedule(50)) == pytest.approx(0.002)
    assert len(net.class_names) == 5


def test_reading_the_registry_imports_no_jax():
    """A sweep's caller reads the registry before its workers start: reading it imports no
    JAX (the sweep's module-level constants come from it)."""
    import subprocess
    import sys
    code = ("import sys, jaxflowers.recipes as r; r.recipe('sweep'); r.IMAGE_SIZE['cifar_net']; "
            "print(sorted(m for m in ('jax', 'flax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_digits_are_scikit_learns_read_without_importing_it():
    """``jf.data.digits`` reads the file ``load_digits`` reads (same pixels and labels), and a
    process that only trains on the digits does not pay scikit-learn's import."""
    from PIL import Image
    from sklearn.datasets import load_digits

    bunch = load_digits()
    data = jf.data.digits(image_size=(16, 16))
    small = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    want = np.stack([np.asarray(Image.fromarray(i).resize((16, 16), Image.Resampling.BICUBIC))
                     for i in small])
    np.testing.assert_array_equal(data.images[..., 0], want)
    np.testing.assert_array_equal(data.labels, bunch.target)
    assert data.images.shape == (1797, 16, 16, 3) and data.class_names[9] == "9"
    code = ("import sys, jaxflowers as jf; jf.data.digits(); "
            "print('sklearn' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.stdout.split() == ["False"], result.stderr[-2000:]
