"""``TrainedNet``: a trained network and what it needs to predict."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

__all__ = ["TrainedNet", "load"]


@dataclasses.dataclass(frozen=True)
class TrainedNet:
    """A trained network: the module, its variables and what it needs to predict.

    Attributes:
      model: the flax module. variables: {"params", "batch_stats"} of numpy arrays.
      class_names: output ``i`` is ``class_names[i]``. input_shape: (H, W, C).
      normalization: per-channel (mean, std), float32 (C,), applied to uint8 inputs.
    """

    model: Any
    variables: dict
    class_names: tuple[str, ...]
    normalization: tuple[np.ndarray, np.ndarray]
    input_shape: tuple[int, int, int]

    @property
    def dtype(self):
        import jax.numpy as jnp

        return getattr(self.model, "dtype", jnp.float32)

    def __repr__(self) -> str:
        from jaxflowers.recipes import model_spec

        try:
            name, kwargs = model_spec(self.model)
            model = f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
        except TypeError:
            model = type(self.model).__name__
        return (f"TrainedNet({model}, {len(self.class_names)} classes, input "
                f"{tuple(self.input_shape)}, {np.dtype(self.dtype).name})")

    def save(self, path: str | os.PathLike):
        """Write this network to one safetensors file for ``load`` (MATLAB's ``save``); the path."""
        from jaxflowers.saving import netfile

        if os.path.isdir(path):
            raise IsADirectoryError(f"cannot save the network to {path}: it is a folder; give "
                                    "a file name such as net.safetensors")
        try:
            plain = self.to_dict()
        except TypeError as error:
            raise TypeError(f"cannot save the network to {path}: {error}") from None
        return netfile.write(path, plain)

    def export(self, path: str | os.PathLike):
        """Write this network as serialized StableHLO (``jax.export``) to ``path``: uint8
        (B, H, W, C) images in, float32 softmax scores out, normalisation included; JAX
        alone runs it (``jax.export.deserialize(data).call(images)``). Returns the path."""
        from jaxflowers.inference.export import export_stablehlo

        return export_stablehlo(self, path)

    def export_onnx(self, path: str | os.PathLike, *, opset: int | None = None):
        """Write this network as ONNX to ``path`` (``exportONNXNetwork``): input "images"
        uint8 (batch, H, W, C), output "scores" float32 (batch, classes), normalisation
        included, computed in float32; opset ``inference.export.OPSET`` by default. Needs
        jax2onnx (``pip install "jaxflowers[export]"``). Returns the path."""
        from jaxflowers.inference.export import OPSET, export_onnx

        return export_onnx(self, path, opset=opset or OPSET)

    def to_dict(self) -> dict:
        """The network as JSON-able data and numpy arrays; TypeError for a non-registry model."""
        from jaxflowers.recipes import model_spec

        name, kwargs = model_spec(self.model)
        return {"model": [name, kwargs], "dtype": np.dtype(self.dtype).name,
                "variables": self.variables, "class_names": list(self.class_names),
                "normalization": [np.asarray(s, np.float32) for s in self.normalization],
                "input_shape": [int(v) for v in self.input_shape]}

    @classmethod
    def from_pretrained(cls, pretrained, class_names=None,
                        input_shape=(224, 224, 3)) -> "TrainedNet":
        """A ``models.Pretrained`` with its file's head as a network to predict with or
        export (MATLAB's ``imagePretrainedNetwork`` then ``minibatchpredict``).

        Args:
          pretrained: from ``models.pretrained`` with the file's number of classes.
          class_names: one name per output (default "0", "1", ...).
          input_shape: (H, W, C) of the images it will be given.

        Raises:
          ValueError: the head is fresh (untrained), or ``class_names`` is of another length.
        """
        if pretrained.fresh_head:
            raise ValueError("this pretrained network's head is fresh (untrained): train it "
                             "first, or load it with the file's number of classes")
        count = pretrained.model.num_classes
        names = tuple(str(c) for c in (class_names or range(count)))
        if len(names) != count:
            raise ValueError(f"{len(names)} class names for a head of {count} outputs")
        return cls(model=pretrained.model, variables=pretrained.variables, class_names=names,
                   normalization=pretrained.normalization,
                   input_shape=tuple(int(v) for v in input_shape))

    @classmethod
    def from_dict(cls, plain: dict) -> "TrainedNet":
        """The network ``to_dict`` described; only registry networks are built."""
        import jax.numpy as jnp

        from jaxflowers.recipes import build_model

        model = build_model(tuple(plain["model"]))
        if plain.get("dtype", "float32") == "bfloat16":
            model = model.clone(dtype=jnp.bfloat16)
        normalization = tuple(np.asarray(s, np.float32) for s in plain["normalization"])
        return cls(model=model, variables=plain["variables"],
                   class_names=tuple(str(c) for c in plain["class_names"]),
                   normalization=normalization,
                   input_shape=tuple(int(v) for v in plain["input_shape"]))


def load(path: str | os.PathLike) -> TrainedNet:
    """Read a network that ``TrainedNet.save`` wrote (MATLAB's ``load``); it predicts alike.

    Raises:
      FileNotFoundError, IsADirectoryError: nothing, or a folder, at ``path``.
      ValueError: the file is not a saved network, is damaged or from a newer jaxflowers.
    """
    from jaxflowers.saving import netfile

    plain = netfile.read(path)
    try:
        return TrainedNet.from_dict(plain)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} does not describe a network jaxflowers can build: "
                         f"{type(error).__name__}: {error}") from error
