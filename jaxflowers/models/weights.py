"""Loading torchvision and timm ResNet weights: the files, the name mapping, ``Pretrained``.

``models.pretrained`` (and ``weights=`` on the ResNet factories, ``models/resnet.py``)
builds the network and calls :func:`load`; this module reads the file and maps its names.

torchvision's and timm's ResNets (``resnet18`` ... ``resnet101``, v1.5) have the same
layers as ``models.resnet`` and name them::

    conv1, bn1                          -> conv_init, bn_init
    layer{s}.{i}.conv{j}, .bn{j}        -> {Block}_{k}/Conv_{j-1}, /BatchNorm_{j-1}
    layer{s}.{i}.downsample.0, .1       -> {Block}_{k}/proj_conv, /proj_norm
    fc                                  -> head

where ``k`` counts blocks over all stages. Convolution weights are (O, I, H, W), flax
kernels (H, W, I, O); the fc weight is (out, in), the head's kernel (in, out); batch norm's
weight, bias, running_mean and running_var are our scale, bias, mean and var (torch's
epsilon is 1e-5, as ours; ``num_batches_tracked`` and the momentum only matter to
training, and are not read). The space-to-depth stem keeps the 7x7 kernel as a plain
convolution stores it, so it loads as is.

The weights expect torchvision's input: RGB in [0, 1], minus (0.485, 0.456, 0.406), over
(0.229, 0.224, 0.225). A :class:`Pretrained` carries that normalisation on the uint8 scale
(x 255), and ``train`` feeds the network with it instead of the training set's own
statistics, so nothing is normalised twice; the trained network records it
(``TrainedNet.normalization``), and ``predict`` and the exports apply it.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from typing import Any

import numpy as np

__all__ = ["Pretrained", "convert", "head_size", "imagenet_normalization", "load",
           "read_state_dict", "torch_name"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # torchvision's transform, on [0, 1] inputs
IMAGENET_STD = (0.229, 0.224, 0.225)
# Our batch-norm leaves and torch's names for them.
_NORM = {"scale": "weight", "bias": "bias", "mean": "running_mean", "var": "running_var"}
_TORCH_SUFFIXES = (".pth", ".pt", ".bin")


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A network with loaded weights, to train from (``imagePretrainedNetwork``'s result).

    Pass it to ``train`` in place of a module: training starts from these weights, any
    variable not here (a replaced head) is drawn from ``TrainingOptions.seed``, and the
    images are normalised with ``normalization`` rather than the training set's statistics.

    Attributes:
      model: the flax module (a ``ResNet`` with torchvision's padding).
      variables: {"params": ..., "batch_stats": ...} of float32 numpy arrays; without the
        head when it was replaced.
      normalization: per-channel (mean, std), float32 (3,), on uint8 inputs (0..255).
      source: the weights file.
    """

    model: Any
    variables: dict
    normalization: tuple[np.ndarray, np.ndarray]
    source: str

    @property
    def fresh_head(self) -> bool:
        """Whether the head is new (drawn when training starts), not the file's."""
        return "head" not in self.variables["params"]

    def __repr__(self) -> str:
        head = "fresh head" if self.fresh_head else "the file's head"
        return (f"Pretrained({type(self.model).__name__}, {self.model.num_classes} classes, "
                f"{head}, weights {self.source})")


def imagenet_normalization() -> tuple[np.ndarray, np.ndarray]:
    """torchvision's ImageNet (mean, std) on the uint8 scale, float32 (3,) each."""
    return (np.asarray(IMAGENET_MEAN, np.float32) * 255,
            np.asarray(IMAGENET_STD, np.float32) * 255)


def load(model, path: str | os.PathLike, arch: str) -> Pretrained:
    """``model`` (a ResNet with ``conv_padding="symmetric"``) with the weights at ``path``.

    Raises:
      FileNotFoundError: no file at ``path``.
      ValueError: an unreadable or truncated file, or one whose tensors are not ``arch``'s
        (a name for messages); the message names the file and the first tensor that differs.
    """
    path = pathlib.Path(path).expanduser()
    variables = convert(model, read_state_dict(path), path, arch)
    return Pretrained(model, variables, imagenet_normalization(), str(path))


def head_size(path: str | os.PathLike) -> int:
    """The number of outputs of the fc layer in the weights file at ``path``."""
    path = pathlib.Path(path).expanduser()
    fc = _strip(read_state_dict(path)).get("fc.weight")
    if fc is None or fc.ndim != 2:
        raise ValueError(f"{path} has no fc layer (a classification head); give num_classes")
    return int(fc.shape[0])


def read_state_dict(path: pathlib.Path) -> dict[str, np.ndarray]:
    """The tensors of a ``.safetensors`` file or a torch state dict, as numpy arrays."""
    if not path.is_file():
        raise FileNotFoundError(f"no weights file at {path}")
    if path.suffix in _TORCH_SUFFIXES:
        return _read_torch(path)
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        try:
            return load_file(str(path))
        except TypeError:  # bfloat16, which numpy lacks: read through JAX
            return _load_bfloat16(path)
    except (SafetensorError, OSError, ValueError, TypeError) as error:
        raise ValueError(f"cannot read weights from {path}: not a complete safetensors file "
                         f"({type(error).__name__}: {error})") from None


def _load_bfloat16(path: pathlib.Path) -> dict[str, np.ndarray]:
    """A safetensors file holding bfloat16 tensors, every float as float32."""
    from safetensors import safe_open

    with safe_open(str(path), framework="flax") as file:
        return {key: np.asarray(file.get_tensor(key), np.float32) for key in file.keys()}


def _read_torch(path: pathlib.Path) -> dict[str, np.ndarray]:
    """A torchvision ``.pth`` state dict (torch's own unpickler, tensors only)."""
    try:
        import torch
    except ImportError:
        raise ValueError(f"cannot read {path}: a torch file needs torch (pip install torch), "
                         "or convert it to .safetensors where torch is installed") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 (torch raises many types for damage)
        raise ValueError(f"cannot read weights from {path}: {type(error).__name__}: "
                         f"{error}".splitlines()[0]) from None
    for key in ("state_dict", "model"):  # training checkpoints wrap the state dict
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise ValueError(f"cannot read weights from {path}: it holds a "
                         f"{type(state).__name__}, not a state dict")
    return {k: v.detach().float().numpy() if v.is_floating_point() else v.numpy()
            for k, v in state.items() if isinstance(v, torch.Tensor)}


def _strip(state: dict) -> dict:
    """The state dict without DistributedDataParallel's ``module.`` prefix."""
    if state and all(k.startswith("module.") for k in state):
        return {k[len("module."):]: v for k, v in state.items()}
    return state


def torch_name(path: tuple[str, ...], stage_sizes) -> str:
    """torchvision's name of the variable at ``path`` (leaf included) of our ResNet."""
    *modules, leaf = path
    suffix = _NORM[leaf] if leaf in _NORM else "weight"  # kernel -> weight, bias -> bias
    if modules == ["conv_init"]:
        return "conv1.weight"
    if modules == ["bn_init"]:
        return f"bn1.{suffix}"
    if modules == ["head"]:
        return "fc.weight" if leaf == "kernel" else "fc.bias"
    match = re.fullmatch(r"\w+Block_(\d+)", modules[0])
    if match is None or len(modules) != 2:
        raise ValueError(f"{'/'.join(path)} is not a ResNet variable")
    stage, index = _block_position(int(match.group(1)), stage_sizes)
    inner = {"proj_conv": "downsample.0", "proj_norm": "downsample.1"}.get(modules[1])
    if inner is None:
        kind, number = modules[1].rsplit("_", 1)
        inner = f"{'conv' if kind == 'Conv' else 'bn'}{int(number) + 1}"
    return f"layer{stage + 1}.{index}.{inner}.{suffix}"


def _block_position(k: int, stage_sizes) -> tuple[int, int]:
    """(stage, index in the stage) of the k-th block counted over all stages."""
    for stage, size in enumerate(stage_sizes):
        if k < size:
            return stage, k
        k -= size
    raise ValueError(f"block {k} is beyond stages {tuple(stage_sizes)}")


def convert(model, state: dict, path, arch: str) -> dict:
    """Our ``{"params", "batch_stats"}`` of ``model`` from a torchvision state dict.

    The head is left out when the file's has another number of outputs. Raises
    ``ValueError`` naming the file and the first tensor missing, of another shape, or
    not part of the network.
    """
    import jax
    import jax.numpy as jnp

    state = _strip(state)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros(
        (1, 32, 32, 3), jnp.float32), train=False))
    variables, used = {}, {k for k in state if k.endswith("num_batches_tracked")}
    leaves = [(keys, leaf) for collection in ("params", "batch_stats")  # torch's order
              for keys, leaf in jax.tree_util.tree_leaves_with_path({collection: shapes.get(
                  collection, {})})]
    for keys, leaf in leaves:
        collection, *inner = (k.key for k in keys)
        name = torch_name(tuple(inner), model.stage_sizes)
        if name not in state:
            raise ValueError(f"{path} is not a {arch}: it has no tensor {name!r} (for "
                             f"{'/'.join(inner)})")
        used.add(name)
        array = _to_flax(np.asarray(state[name]), inner[-1], len(leaf.shape))
        if array.shape != leaf.shape:
            if inner[0] == "head" and _is_head_width_only(state, model):
                continue  # another head size: the head is fresh
            raise ValueError(f"{path} is not a {arch}: tensor {name!r} has shape "
                             f"{tuple(state[name].shape)}, the network's {'/'.join(inner)} "
                             f"needs {_torch_shape(leaf.shape)}")
        node = variables.setdefault(collection, {})
        for key in inner[:-1]:
            node = node.setdefault(key, {})
        node[inner[-1]] = array.astype(np.float32)
    extra = [k for k in state if k not in used]
    if extra:
        raise ValueError(f"{path} is not a {arch}: it has tensor {extra[0]!r}, which the "
                         f"network lacks ({len(extra)} such in all; a deeper network's file?)")
    return variables


def _to_flax(array: np.ndarray, leaf: str, ndim: int) -> np.ndarray:
    if leaf == "kernel" and array.ndim == 4 and ndim == 4:
        return array.transpose(2, 3, 1, 0)  # OIHW -> HWIO
    if leaf == "kernel" and array.ndim == 2 and ndim == 2:
        return array.T  # (out, in) -> (in, out)
    return array


def _torch_shape(shape) -> tuple:
    if len(shape) == 4:
        return (shape[3], shape[2], shape[0], shape[1])
    return tuple(reversed(shape)) if len(shape) == 2 else tuple(shape)


def _is_head_width_only(state: dict, model) -> bool:
    """Whether the file's fc differs from the head in its outputs only."""
    fc = state.get("fc.weight")
    return fc is not None and fc.ndim == 2 and fc.shape[0] != model.num_classes
