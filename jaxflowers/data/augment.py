"""On-device augmentation in jax.numpy: MATLAB's ``imageDataAugmenter``, run inside the step.

Each sample's key comes from its position in the *global* batch, so a seed gives the same batch
on 1 or N devices. JAX is imported inside the functions (a sweep's caller must not load it).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import jax

__all__ = ["Augmentation", "Draws", "normalize", "translate"]


def _check_range(name: str, value) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"Augmentation({name}={value!r}) must be a (low, high) pair of "
                         "integer pixel offsets, e.g. (-30, 30)") from None
    if lo > hi:
        raise ValueError(f"Augmentation({name}={value!r}): low {lo} is above high {hi}")
    return lo, hi


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """Random geometric augmentation applied on the device (``imageDataAugmenter``).

    Attributes:
      reflect_x, reflect_y: flip with probability 1/2 (``RandXReflection``, ``RandYReflection``).
      translate_x, translate_y: inclusive ranges of whole-pixel shifts, zero fill
        (``RandXTranslation``, ``RandYTranslation``).
      random_crop: ``(height, width)`` of a crop at a random position (``"randcrop"``), or None.
    """

    reflect_x: bool = False  # random left-right mirror
    reflect_y: bool = False  # random top-bottom mirror
    translate_x: tuple[int, int] = (0, 0)  # pixels, inclusive, zero fill
    translate_y: tuple[int, int] = (0, 0)  # pixels, inclusive, zero fill
    random_crop: tuple[int, int] | None = None  # output (height, width)

    def __post_init__(self):
        object.__setattr__(self, "translate_x", _check_range("translate_x", self.translate_x))
        object.__setattr__(self, "translate_y", _check_range("translate_y", self.translate_y))
        if self.random_crop is not None:
            crop = tuple(int(v) for v in self.random_crop)
            if len(crop) != 2 or min(crop) < 1:
                raise ValueError(f"Augmentation(random_crop={self.random_crop!r}) must be a "
                                 "(height, width) pair of positive integers or None")
            object.__setattr__(self, "random_crop", crop)

    def output_shape(self, image_shape: tuple[int, int, int]) -> tuple[int, int, int]:
        """(H, W, C) of the augmented images for inputs of ``image_shape``."""
        height, width, channels = image_shape
        if self.random_crop is None:
            return image_shape
        if self.random_crop[0] > height or self.random_crop[1] > width:
            raise ValueError(f"Augmentation(random_crop={self.random_crop}) is larger than the "
                             f"{height}x{width} images")
        return (*self.random_crop, channels)

    def __call__(self, images: jax.Array, keys: jax.Array) -> jax.Array:
        """Augment (B, H, W, C) ``images`` of any dtype with ``keys``: (B,) typed or (B, 2) raw.

        Returns (B, H', W', C) of the input dtype; H', W' differ only with ``random_crop``.
        """
        return self.apply(images, self.draw(keys, images.shape[1:3]))

    def draw(self, keys: jax.Array, image_size: tuple[int, int]) -> Draws:
        """Each sample's random choices, from its key ((B,) typed or (B, 2) raw keys), for
        (H, W) images. Drawn apart from ``apply``, a training block draws all its iterations'
        choices in one program step, before its loop."""
        import jax

        return jax.vmap(lambda key: self._draw(key, image_size))(keys)

    def apply(self, images: jax.Array, draws: Draws) -> jax.Array:
        """(B, H, W, C) ``images`` of any dtype transformed by ``draws`` (from ``draw``)."""
        import jax

        return jax.vmap(self._apply)(images, draws)

    def _draw(self, key: jax.Array, image_size: tuple[int, int]) -> Draws:
        import jax
        import jax.numpy as jnp

        k_fx, k_fy, k_tx, k_ty, k_cy, k_cx = jax.random.split(key, 6)
        no = jnp.zeros((), bool)
        zero = jnp.zeros((), jnp.int32)
        shifts = crop = (zero, zero)
        if self.translate_x != (0, 0) or self.translate_y != (0, 0):
            shifts = (jax.random.randint(k_tx, (), self.translate_x[0], self.translate_x[1] + 1),
                      jax.random.randint(k_ty, (), self.translate_y[0], self.translate_y[1] + 1))
        if self.random_crop is not None:
            crop = (jax.random.randint(k_cy, (), 0, image_size[0] - self.random_crop[0] + 1),
                    jax.random.randint(k_cx, (), 0, image_size[1] - self.random_crop[1] + 1))
        return Draws(flip_x=jax.random.bernoulli(k_fx) if self.reflect_x else no,
                     flip_y=jax.random.bernoulli(k_fy) if self.reflect_y else no,
                     dx=shifts[0], dy=shifts[1], y0=crop[0], x0=crop[1])

    def _apply(self, image: jax.Array, draws: Draws) -> jax.Array:
        import jax.numpy as jnp
        from jax import lax

        if self.reflect_x:
            image = jnp.where(draws.flip_x, image[:, ::-1], image)
        if self.reflect_y:
            image = jnp.where(draws.flip_y, image[::-1], image)
        if self.translate_x != (0, 0) or self.translate_y != (0, 0):
            image = translate(image, draws.dx, draws.dy)
        if self.random_crop is not None:
            height, width = self.random_crop
            image = lax.dynamic_slice(image, (draws.y0, draws.x0, 0),
                                      (height, width, image.shape[2]))
        return image


class Draws(NamedTuple):
    """One sample's random choices (or a batch's, one per sample, along leading axes)."""

    flip_x: jax.Array  # bool: mirror left-right
    flip_y: jax.Array  # bool: mirror top-bottom
    dx: jax.Array  # int32: shift right, pixels
    dy: jax.Array  # int32: shift down, pixels
    y0: jax.Array  # int32: the crop's top row
    x0: jax.Array  # int32: the crop's left column


def translate(image: jax.Array, dx, dy) -> jax.Array:
    """Shift one (H, W, C) image right by ``dx`` and down by ``dy`` pixels, filling zeros."""
    import jax.numpy as jnp

    # Two gathers and a mask, which XLA fuses into one pass; padding would need a large temporary.
    # The indices are clipped, so the gathers need no bounds checks of their own.
    height, width = image.shape[:2]
    ys = jnp.arange(height) - dy
    xs = jnp.arange(width) - dx
    moved = image.at[jnp.clip(ys, 0, height - 1)].get(mode="promise_in_bounds")
    moved = moved.at[:, jnp.clip(xs, 0, width - 1)].get(mode="promise_in_bounds")
    inside = ((ys >= 0) & (ys < height))[:, None] & ((xs >= 0) & (xs < width))[None, :]
    return jnp.where(inside[..., None], moved, jnp.zeros((), image.dtype))


def normalize(images: jax.Array, mean: jax.Array, std: jax.Array, dtype) -> jax.Array:
    """(B, H, W, C) uint8 -> ``dtype``, minus the per-channel ``mean``, over ``std``."""
    import jax.numpy as jnp

    return ((images.astype(jnp.float32) - mean) / std).astype(dtype)  # float32, then cast
