"""The ResNet stem convolution (7x7, stride 2, padding 3), computed space-to-depth.

Stride 2 over 3 channels leaves tensor cores idle; 2x2 pixel blocks as channels make it a
stride-1 4x4 convolution over 12 (as MLPerf's ResNet-50). The kernel padded to 8x8 maps padded
row ``2o + 2a + b`` to blocked row ``o + a``, sub-row ``b``; the parameter stays ``nn.Conv``'s.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jax import lax

from jaxflowers.models.layers import param

__all__ = ["StemConv", "blocked_kernel", "space_to_depth"]

_DIMS = ("NHWC", "HWIO", "NHWC")


def space_to_depth(x: jnp.ndarray) -> jnp.ndarray:
    """(B, 2H, 2W, C) -> (B, H, W, 4C), each 2x2 block in (row, column, channel) order."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h // 2, w // 2, 4 * c)


def blocked_kernel(kernel: jnp.ndarray) -> jnp.ndarray:
    """A (7, 7, C, F) stride-2 kernel as the equivalent (4, 4, 4C, F) stride-1 kernel."""
    kh, kw, c, f = kernel.shape
    k = jnp.pad(kernel, ((0, 8 - kh), (0, 8 - kw), (0, 0), (0, 0)))
    k = k.reshape(4, 2, 4, 2, c, f).transpose(0, 2, 1, 3, 4, 5)
    return k.reshape(4, 4, 4 * c, f)


class StemConv(nn.Module):
    """``nn.Conv(features, (7, 7), (2, 2), padding=3, use_bias=False)`` done space-to-depth."""

    features: int
    dtype: Any = jnp.float32
    kernel_init: Any = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x):
        kernel = param(self, "kernel", self.kernel_init, (7, 7, x.shape[-1], self.features))
        h, w = x.shape[1:3]
        # Padding 3 on each side, plus one row/column on odd sizes so the blocks tile; the
        # extra zeros only meet the kernel's zero eighth row/column.
        x = jnp.pad(x.astype(self.dtype), ((0, 0), (3, 3 + h % 2), (3, 3 + w % 2), (0, 0)))
        kernel = blocked_kernel(kernel).astype(self.dtype)
        return lax.conv_general_dilated(space_to_depth(x), kernel, (1, 1), "VALID",
                                        dimension_numbers=_DIMS)
