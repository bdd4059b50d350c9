"""On-device augmentation: exact mirrors and shifts, zero fill, shapes, dtypes, bad input."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxflowers as jf
from jaxflowers.data import Augmentation
from jaxflowers.data.augment import translate


def _images(n=6, h=7, w=9):
    return np.random.default_rng(0).integers(1, 256, size=(n, h, w, 3), dtype=np.uint8)


def _keys(n, seed=0):
    return jax.random.split(jax.random.PRNGKey(seed), n)


def test_reflection_is_an_exact_mirror_or_identity():
    images = _images(32)
    out = np.asarray(Augmentation(reflect_x=True)(jnp.asarray(images), _keys(32)))
    flipped = [np.array_equal(o, i[:, ::-1]) for o, i in zip(out, images)]
    kept = [np.array_equal(o, i) for o, i in zip(out, images)]
    assert all(f or k for f, k in zip(flipped, kept))
    assert 0 < sum(flipped) < 32  # both outcomes occur


def test_vertical_reflection():
    images = _images(32)
    out = np.asarray(Augmentation(reflect_y=True)(jnp.asarray(images), _keys(32)))
    assert all(np.array_equal(o, i[::-1]) or np.array_equal(o, i) for o, i in zip(out, images))


@pytest.mark.parametrize("dx, dy", [(0, 0), (2, 0), (0, -3), (-4, 1), (3, 5), (20, 0)])
def test_translation_moves_pixels_exactly_and_fills_zeros(dx, dy):
    image = _images(1)[0]
    out = np.asarray(translate(jnp.asarray(image), dx, dy))
    h, w, _ = image.shape
    expected = np.zeros_like(image)
    for y in range(h):
        for x in range(w):
            if 0 <= y - dy < h and 0 <= x - dx < w:
                expected[y, x] = image[y - dy, x - dx]
    np.testing.assert_array_equal(out, expected)


def test_random_translation_stays_within_range():
    images = np.ones((64, 10, 10, 3), np.uint8)
    out = np.asarray(Augmentation(translate_x=(-2, 2), translate_y=(0, 3))(
        jnp.asarray(images), _keys(64)))
    for o in out:
        cols = np.flatnonzero(o[..., 0].any(axis=0))
        rows = np.flatnonzero(o[..., 0].any(axis=1))
        dx = cols[0] if cols[0] > 0 else -(9 - cols[-1])
        dy = rows[0]
        assert -2 <= dx <= 2 and 0 <= dy <= 3
        assert o.sum() == 3 * (10 - abs(dx)) * (10 - dy)  # the uncovered strip is zero


def test_random_crop_shape_and_content():
    images = _images(8, 12, 12)
    out = np.asarray(Augmentation(random_crop=(5, 6))(jnp.asarray(images), _keys(8)))
    assert out.shape == (8, 5, 6, 3) and out.dtype == np.uint8
    for o, i in zip(out, images):  # every crop is a window of its source
        assert any(np.array_equal(o, i[y:y + 5, x:x + 6]) for y in range(8) for x in range(7))


def test_shapes_and_dtype_kept_and_deterministic():
    images = jnp.asarray(_images())
    aug = Augmentation(reflect_x=True, translate_x=(-3, 3), translate_y=(-3, 3))
    out = aug(images, _keys(6))
    assert out.shape == images.shape and out.dtype == jnp.uint8
    np.testing.assert_array_equal(out, aug(images, _keys(6)))
    assert aug.output_shape((7, 9, 3)) == (7, 9, 3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(translate_x=(3, -3)), "low 3 is above high -3"),
    (dict(translate_y=5), r"translate_y=5\) must be a \(low, high\) pair"),
    (dict(random_crop=(0, 4)), "random_crop=.* positive integers"),
])
def test_bad_augmentation_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Augmentation(**kwargs)


def test_crop_larger_than_image_is_refused():
    with pytest.raises(ValueError, match="larger than the 4x4 images"):
        Augmentation(random_crop=(5, 5)).output_shape((4, 4, 3))


@pytest.mark.parametrize("strategy", ["shard_map", "pmap"])
def test_resident_channel_stats_equal_the_host_ones(strategy):
    """A resident set is measured where it lies (integer sums per device); the network's
    normalisation equals the host's float64 statistics."""
    import flax.linen as nn

    from jaxflowers.data.moments import channel_stats

    class Flat(nn.Module):
        @nn.compact
        def __call__(self, x, train=True):
            return nn.Dense(2)(x.reshape(x.shape[0], -1))

    rng = np.random.default_rng(0)
    data = jf.data.ImageSet(rng.integers(0, 256, (37, 9, 11, 3), dtype=np.uint8),
                            rng.integers(0, 2, 37), ("a", "b"))
    execution = jf.ExecutionOptions(strategy=strategy, data_placement="resident")
    net, _ = jf.train(data, Flat(), jf.TrainingOptions(mini_batch_size=8, max_epochs=1,
                                                       verbose=False), execution=execution)
    mean, std = net.normalization
    expected = channel_stats(data.images)
    np.testing.assert_allclose(mean, expected[0], rtol=1e-6)
    np.testing.assert_allclose(std, expected[1], rtol=1e-6)
    pixels = data.images.reshape(-1, 3).astype(np.float64)
    np.testing.assert_allclose(mean, pixels.mean(0), rtol=1e-6)
    np.testing.assert_allclose(std, pixels.std(0), rtol=1e-6)
    streamed, _ = jf.train(data, Flat(), jf.TrainingOptions(mini_batch_size=8, max_epochs=1,
                                                            verbose=False),
                           execution=jf.ExecutionOptions(strategy=strategy,
                                                         data_placement="stream"))
    for resident, host in zip(net.normalization, streamed.normalization):
        np.testing.assert_array_equal(resident, host)  # the same integer sums either way
