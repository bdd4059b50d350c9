"""ResNet v1.5 (He et al. 2016; stride on the bottleneck's 3x3), torchvision's parameter layout."""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

from jaxflowers.models import stem_pool
from jaxflowers.models.layers import Conv, Dense
from jaxflowers.models.maxpool import max_pool
from jaxflowers.models.norm import BatchNorm
from jaxflowers.models.stem import StemConv

__all__ = ["BLOCKS", "BasicBlock", "BottleneckBlock", "ModuleDef", "ResNet", "VARIANTS",
           "pretrained", "resnet", "resnet101", "resnet18", "resnet34", "resnet50"]

ModuleDef = Any

# He-normal as torchvision initialises ResNets (kaiming_normal_, fan_out, relu gain).
_he_normal = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with an identity or 1x1-projection shortcut (ResNet-18/34)."""

    filters: int
    conv: ModuleDef
    norm: ModuleDef
    strides: tuple[int, int] = (1, 1)
    padding: Any = "SAME"  # of the 3x3 convolutions (see ResNet.conv_padding)
    expansion = 1

    @nn.compact
    def __call__(self, x):
        residual = x
        y = self.norm(relu=True)(self.conv(self.filters, (3, 3), self.strides,
                                           padding=self.padding)(x))
        # Zero-initialised last scale: every block starts as the identity, which lets deep
        # nets trained from scratch take large learning rates (Goyal et al. 2017).
        y = self.norm(scale_init=nn.initializers.zeros)(self.conv(self.filters, (3, 3))(y))
        if residual.shape != y.shape:
            residual = self.conv(self.filters, (1, 1), self.strides, name="proj_conv")(residual)
            residual = self.norm(name="proj_norm")(residual)
        return nn.relu(residual + y)


class BottleneckBlock(nn.Module):
    """1x1 reduce, 3x3 (strided, v1.5), 1x1 expand x4, with a projection where shapes change."""

    filters: int
    conv: ModuleDef
    norm: ModuleDef
    strides: tuple[int, int] = (1, 1)
    padding: Any = "SAME"  # of the 3x3 convolution (see ResNet.conv_padding)
    expansion = 4

    @nn.compact
    def __call__(self, x):
        residual = x
        y = self.norm(relu=True)(self.conv(self.filters, (1, 1))(x))
        y = self.norm(relu=True)(self.conv(self.filters, (3, 3), self.strides,
                                           padding=self.padding)(y))
        y = self.conv(self.filters * 4, (1, 1))(y)
        y = self.norm(scale_init=nn.initializers.zeros)(y)  # see BasicBlock
        if residual.shape != y.shape:
            residual = self.conv(self.filters * 4, (1, 1), self.strides, name="proj_conv")(residual)
            residual = self.norm(name="proj_norm")(residual)
        return nn.relu(residual + y)


class ResNet(nn.Module):
    """ResNet for NHWC images; returns float32 logits (B, num_classes).

    Attributes:
      stage_sizes, block_cls: blocks per stage, e.g. (3, 4, 6, 3), and their class.
      num_classes, num_filters: width of the head; filters of the first stage (doubling).
      dtype: compute dtype (bfloat16 on GPU); parameters stay float32.
      bn_axis_name: mesh axis for synchronised batch norm, or None (per device).
      stem: "space_to_depth" (same parameters, faster on GPUs) or "conv".
      conv_padding: 3x3 convolutions' padding: "same" (XLA's: a stride-2 one pads an even
        input at the end only) or "symmetric" (every side, as torchvision and timm, whose
        weights expect it; ``models.pretrained``).
    """

    stage_sizes: Sequence[int]
    block_cls: ModuleDef
    num_classes: int = 1000
    num_filters: int = 64
    dtype: Any = jnp.float32
    bn_axis_name: str | None = None
    stem: str = "space_to_depth"
    conv_padding: str = "same"

    @nn.compact
    def __call__(self, x, train: bool = True):
        conv = functools.partial(Conv, use_bias=False, dtype=self.dtype,
                                 kernel_init=_he_normal)
        norm_args = dict(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                         dtype=self.dtype, axis_name=self.bn_axis_name)
        norm = functools.partial(BatchNorm, **norm_args)
        if self.stem == "space_to_depth":
            x = StemConv(self.num_filters, dtype=self.dtype, kernel_init=_he_normal,
                         name="conv_init")(x)
        elif self.stem == "conv":
            x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)],
                     name="conv_init")(x)
        else:
            raise ValueError(f"stem={self.stem!r}: expected 'space_to_depth' or 'conv'")
        if self.conv_padding not in PADDINGS:
            raise ValueError(f"conv_padding={self.conv_padding!r}: expected one of "
                             f"{', '.join(PADDINGS)}")
        if stem_pool.used(x, train):  # one kernel on GPUs: the same variables and values
            x = stem_pool.BatchNormReLUPool(**norm_args, name="bn_init", relu=True)(x)
        else:
            x = norm(name="bn_init", relu=True)(x)
            x = max_pool(x, stem_pool.WINDOW, stem_pool.STRIDES, stem_pool.PADDING, train=train)
        for stage, num_blocks in enumerate(self.stage_sizes):
            for block in range(num_blocks):
                strides = (2, 2) if stage > 0 and block == 0 else (1, 1)
                x = self.block_cls(self.num_filters * 2**stage, conv=conv, norm=norm,
                                   strides=strides, padding=PADDINGS[self.conv_padding])(x)
        x = jnp.mean(x, axis=(1, 2))
        x = Dense(self.num_classes, dtype=self.dtype, name="head")(x)
        return x.astype(jnp.float32)


PADDINGS = {"same": "SAME", "symmetric": ((1, 1), (1, 1))}
BLOCKS = {"basic": BasicBlock, "bottleneck": BottleneckBlock}
# The published depths: (stage sizes, block).
VARIANTS = {"resnet18": ((2, 2, 2, 2), "basic"), "resnet34": ((3, 4, 6, 3), "basic"),
            "resnet50": ((3, 4, 6, 3), "bottleneck"), "resnet101": ((3, 4, 23, 3), "bottleneck")}


def resnet(stage_sizes: Sequence[int], block: str = "bottleneck", num_classes: int = 1000,
           *, weights=None, **kwargs):
    """A ResNet of any stage sizes (the published ones are ``resnet18`` ... ``resnet101``).

    Args:
      stage_sizes: blocks per stage, e.g. (3, 4, 6, 3).
      block: "basic" (two 3x3 convolutions) or "bottleneck" (1x1, 3x3, 1x1).
      num_classes: outputs of the head.
      weights: a torchvision or timm weights file to start from (``models.pretrained``), or
        None for a fresh network.
      **kwargs: ``num_filters``, ``stem``, ``conv_padding``, ``dtype``, ``bn_axis_name``.

    Returns:
      A ``ResNet``; with ``weights``, a ``models.Pretrained`` holding one.
    """
    if weights is not None:
        spec = ("resnet", {"stage_sizes": list(stage_sizes), "block": block})
        return pretrained(spec, num_classes, weights=weights, **kwargs)
    if block not in BLOCKS:
        raise ValueError(f"resnet(block={block!r}): use one of {', '.join(BLOCKS)}")
    return ResNet(stage_sizes=tuple(int(n) for n in stage_sizes), block_cls=BLOCKS[block],
                  num_classes=num_classes, **kwargs)


def _variant(name: str) -> Callable[..., ResNet]:
    stage_sizes, block = VARIANTS[name]

    def build(num_classes: int = 1000, *, weights=None, **kwargs):
        if weights is not None:
            return pretrained(name, num_classes, weights=weights, **kwargs)
        return resnet(stage_sizes, block, num_classes, **kwargs)
    build.__name__ = build.__qualname__ = name
    return build


def pretrained(name, num_classes: int | None = None, *, weights, **kwargs):
    """A ResNet with torchvision or timm weights (``imagePretrainedNetwork``).

    Args:
      name: "resnet18", "resnet34", "resnet50" or "resnet101", or a registry spec
        ``("resnet", {"stage_sizes": [...], "block": ..., "num_filters": ...})``.
      num_classes: outputs of the head. The file's own head is kept when it has this many
        outputs (or when None); otherwise the head is fresh, drawn when training starts, as
        MATLAB's ``imagePretrainedNetwork(name, NumClasses=n)``.
      weights: a ``.safetensors`` file (timm's and the hub's format; read without torch),
        or a torchvision ``.pth`` state dict (``torch.load(weights_only=True)``; needs
        torch). Nothing is downloaded.
      **kwargs: further ``ResNet`` fields (``dtype``, ``stem``).

    Returns:
      A ``models.Pretrained`` for ``train``: the module (torchvision's padding,
      ``conv_padding="symmetric"``), its weights and ImageNet's normalisation.

    Raises:
      FileNotFoundError: no file at ``weights``.
      ValueError: ``num_classes`` < 1, an unreadable or truncated file, or one whose
        tensors are not this network's; the message names the file and the first tensor
        that differs.
    """
    from jaxflowers.models import weights as loading

    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(
            num_classes, int) or num_classes < 1):
        raise ValueError(f"num_classes={num_classes!r} must be a positive integer or None")
    stage_sizes, block, arch, kwargs = _named(name, kwargs)
    classes = num_classes or loading.head_size(weights)
    model = resnet(stage_sizes, block, classes, **{**kwargs, "conv_padding": "symmetric"})
    if model.num_filters != 64:
        arch += f", {model.num_filters} first-stage filters"
    return loading.load(model, weights, arch)


def _named(name, kwargs: dict):
    """(stage sizes, block, a name for messages, ResNet fields) of a name or spec."""
    if isinstance(name, str) and name in VARIANTS:
        return (*VARIANTS[name], name, kwargs)
    if isinstance(name, (tuple, list)) and len(name) == 2 and name[0] == "resnet":
        fields = {**name[1], **kwargs}
        sizes, block = tuple(fields.pop("stage_sizes")), fields.pop("block", "bottleneck")
        return sizes, block, f"resnet of stages {sizes} ({block} blocks)", fields
    raise ValueError(f"pretrained({name!r}): weights load into {', '.join(VARIANTS)} or "
                     "('resnet', {'stage_sizes': [...], 'block': ...})")


resnet18, resnet34, resnet50, resnet101 = map(_variant, VARIANTS)
resnet50.__doc__ = """ResNet-50 v1.5 (``imagePretrainedNetwork("resnet50", Weights="none")``).

He-normal initialisation, batch norm.

Args:
  num_classes: number of output classes (5 for Flowers).
  weights: a torchvision or timm ResNet-50 file (``.safetensors``, or ``.pth`` with torch)
    to start from: ``imagePretrainedNetwork("resnet50", NumClasses=num_classes)``
    (``models.pretrained``). None: freshly initialised.
  **kwargs: ``dtype``, ``bn_axis_name``, ``num_filters``, ``stem`` or ``conv_padding``
    (see ``ResNet``).

Returns:
  A ``ResNet`` module; ``apply(variables, x, train=...)`` maps (B, H, W, 3) to (B, num_classes).
  With ``weights``, a ``models.Pretrained`` holding one and its weights, for ``train``.
"""
