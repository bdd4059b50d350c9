"""The ResNet stem convolution (7x7, stride 2, padding 3), computed space-to-depth.

A stride-2 convolution over 3 channels keeps the GPU's tensor cores mostly idle: each
output reads a 7x7x3 patch, and cuDNN pads the 3 channels to 8. Rearranging every 2x2
pixel block into channels turns the same arithmetic into a stride-1 4x4 convolution over
12 channels (MLPerf's ResNet-50 does the same): with the 7x7 kernel zero-padded to 8x8,
output ``o`` reads padded rows ``2o + k`` for ``k = 2a + b`` (``a`` in 0..3, ``b`` in
0..1), which is row ``o + a`` of the 2x2-blocked image, sub-row ``b``. The parameter is
still the 7x7x3xF kernel (same name, shape, initialiser and count as ``nn.Conv``'s), so
checkpoints and parameter counts do not change; only the computation does.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jax import lax

from jaxflowers.models.layers import param

_DIMS = ("NHWC", "HWIO", "NHWC")


def space_to_depth(x: jnp.ndarray) -> jnp.ndarray:
    """(B, 2H, 2W, C) -> (B, H, W, 4C), each 2x2 block's pixels in (row, column, channel) order."""
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
    """``nn.Conv(features, (7, 7), (2, 2), padding=3, use_bias=False)`` done space-to-depth.

    Attributes:
      features: output channels.
      dtype: compute dtype; the kernel parameter stays float32.
      kernel_init: initialiser of the (7, 7, C, features) kernel.
    """

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
