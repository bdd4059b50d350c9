"""On-device augmentation in jax.numpy: MATLAB's ``imageDataAugmenter``, run inside the step.

Each sample's key comes from its position in the *global* batch, so a seed gives the same batch
on 1 or N devices. JAX is imported inside the functions (a sweep's caller must not load it).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jax

__all__ = ["Augmentation", "normalize", "translate"]


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
        import jax

        return jax.vmap(self._one)(images, keys)

    def _one(self, image: jax.Array, key: jax.Array) -> jax.Array:
        import jax
        import jax.numpy as jnp
        from jax import lax

        k_fx, k_fy, k_tx, k_ty, k_cy, k_cx = jax.random.split(key, 6)
        if self.reflect_x:
            image = jnp.where(jax.random.bernoulli(k_fx), image[:, ::-1], image)
        if self.reflect_y:
            image = jnp.where(jax.random.bernoulli(k_fy), image[::-1], image)
        if self.translate_x != (0, 0) or self.translate_y != (0, 0):
            dx = jax.random.randint(k_tx, (), self.translate_x[0], self.translate_x[1] + 1)
            dy = jax.random.randint(k_ty, (), self.translate_y[0], self.translate_y[1] + 1)
            image = translate(image, dx, dy)
        if self.random_crop is not None:
            height, width = self.random_crop
            y0 = jax.random.randint(k_cy, (), 0, image.shape[0] - height + 1)
            x0 = jax.random.randint(k_cx, (), 0, image.shape[1] - width + 1)
            image = lax.dynamic_slice(image, (y0, x0, 0), (height, width, image.shape[2]))
        return image


def translate(image: jax.Array, dx, dy) -> jax.Array:
    """Shift one (H, W, C) image right by ``dx`` and down by ``dy`` pixels, filling zeros."""
    import jax.numpy as jnp

    # Two gathers and a mask, which XLA fuses into one pass; padding would need a large temporary.
    height, width = image.shape[:2]
    ys = jnp.arange(height) - dy
    xs = jnp.arange(width) - dx
    moved = jnp.take(image, jnp.clip(ys, 0, height - 1), axis=0)
    moved = jnp.take(moved, jnp.clip(xs, 0, width - 1), axis=1)
    inside = ((ys >= 0) & (ys < height))[:, None] & ((xs >= 0) & (xs < width))[None, :]
    return jnp.where(inside[..., None], moved, jnp.zeros((), image.dtype))


def normalize(images: jax.Array, mean: jax.Array, std: jax.Array, dtype) -> jax.Array:
    """(B, H, W, C) uint8 -> ``dtype``, minus the per-channel ``mean``, over ``std``."""
    import jax.numpy as jnp

    return ((images.astype(jnp.float32) - mean) / std).astype(dtype)  # float32, then cast
