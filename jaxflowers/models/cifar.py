"""The MATLAB parfeval example's ``createNetworkArchitecture(netDepth)`` in Flax."""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxflowers.models.layers import Conv, Dense
from jaxflowers.models.maxpool import max_pool
from jaxflowers.models.norm import BatchNorm

__all__ = ["CifarNet", "cifar_net", "cifar_width"]


def cifar_width(depth: int) -> int:
    """Filters of the first block: ``round(16 / sqrt(depth))`` (MATLAB rounds halves up)."""
    return int(math.floor(16.0 / math.sqrt(depth) + 0.5))


class CifarNet(nn.Module):
    """Three blocks of ``depth`` x [3x3 conv, batch norm, ReLU] (width, 2x, 4x filters), pools,
    and a dense layer, with MATLAB's Glorot-uniform weights and zero biases. Each convolution
    keeps its bias, but the batch norm after it applies it to its mean (``BatchNorm(offset=)``):
    the same network, without a pass and a gradient reduction per layer in training.

    Attributes:
      depth: convolutions per block (1-4 in the example).
      num_classes, dtype: outputs; compute dtype (parameters stay float32).
      width: filters of the first block; None: ``cifar_width(depth)``, the example's.
      bn_axis_name: mesh axis for synchronised batch norm, or None.
      dense_init: name of the dense kernel's ``flax.linen.initializers`` function (JSON-able).
      channel_multiple: compute each convolution on channels rounded up to this multiple
        (zeros; stored weights, outputs and gradients unchanged), which spares cuDNN padding
        odd widths such as depth 3's 9/18/36 for the tensor cores. None: 8 when training on a
        GPU, else 1 (inference and export see the stored widths).
    """

    depth: int
    num_classes: int = 10
    dtype: Any = jnp.float32
    bn_axis_name: str | None = None
    dense_init: str = "glorot_uniform"
    width: int | None = None
    channel_multiple: int | None = None

    @nn.compact
    def __call__(self, x, train: bool = True):
        width = cifar_width(self.depth) if self.width is None else self.width
        multiple = self.channel_multiple
        if multiple is None:
            multiple = 8 if train and jax.default_backend() == "gpu" else 1
        stored = x.shape[-1]  # the channels x stands for; any beyond are zeros
        for block, filters in enumerate((width, 2 * width, 4 * width)):
            computed = -(-filters // multiple) * multiple
            for _ in range(self.depth):
                padded = computed != filters or x.shape[-1] != stored
                # the bias is folded into batch norm's mean: no pass over the output and
                # no reduction for its gradient (which batch norm makes zero)
                conv = Conv(computed, (3, 3), padding="SAME", dtype=self.dtype,
                            kernel_init=nn.initializers.glorot_uniform(), fold_bias=True,
                            stored_features=(stored, filters) if padded else None)
                x = conv(x)
                x = BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                              dtype=self.dtype, axis_name=self.bn_axis_name, relu=True,
                              channels=filters if computed != filters else None)(
                                  x, offset=conv.folded_bias())
                stored = filters
            if block < 2:
                x = max_pool(x, (2, 2), strides=(2, 2), train=train)
        if x.shape[-1] != stored:
            x = x[..., :stored]
        x = nn.avg_pool(x, window_shape=(8, 8), strides=(8, 8))  # keywords: jax2onnx's patch
        x = x.reshape(x.shape[0], -1)
        kernel_init = getattr(nn.initializers, self.dense_init)()
        logits = Dense(self.num_classes, dtype=self.dtype, kernel_init=kernel_init)(x)
        return logits.astype(jnp.float32)


def cifar_net(depth: int, num_classes: int = 10, **kwargs) -> CifarNet:
    """The sweep's CIFAR-10 network of a given depth (``createNetworkArchitecture(depth)``).

    Args:
      depth: convolutions per block, a positive integer.
      num_classes: number of classes (10 for CIFAR-10).
      **kwargs: ``width``, ``dtype``, ``bn_axis_name``, ``dense_init`` or
        ``channel_multiple`` (see ``CifarNet``).

    Returns:
      A ``CifarNet`` mapping (B, 32, 32, 3) to float32 logits (B, num_classes).
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"cifar_net(depth={depth!r}): depth must be a positive integer")
    width = kwargs.get("width")
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
        raise ValueError(f"cifar_net(width={width!r}): width must be a positive integer or None")
    multiple = kwargs.get("channel_multiple")
    if multiple is not None and (isinstance(multiple, bool) or not isinstance(multiple, int)
                                 or multiple < 1):
        raise ValueError(f"cifar_net(channel_multiple={multiple!r}): channel_multiple must be "
                         "a positive integer or None")
    dense_init = kwargs.get("dense_init", "glorot_uniform")
    if not (isinstance(dense_init, str) and callable(getattr(nn.initializers, dense_init, None))):
        raise ValueError(f"cifar_net(dense_init={dense_init!r}): name a flax.linen.initializers "
                         'function, e.g. "glorot_uniform" or "lecun_normal"')
    return CifarNet(depth=depth, num_classes=num_classes, **kwargs)
