"""``TrainedNet``: a trained network and what it needs to predict."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class TrainedNet:
    """A trained network: the module, its variables and what it needs to predict.

    Attributes:
      model: the flax module (compute dtype as trained, per-device batch norm).
      variables: {"params": ..., "batch_stats": ...} of numpy arrays.
      class_names: tuple of str, output ``i`` is class ``class_names[i]``.
      normalization: per-channel (mean, std), float32 (C,), applied to uint8 inputs.
      input_shape: (H, W, C) the network expects.
    """

    model: Any
    variables: dict
    class_names: tuple[str, ...]
    normalization: tuple[np.ndarray, np.ndarray]
    input_shape: tuple[int, int, int]

    @property
    def dtype(self):
        return getattr(self.model, "dtype", jnp.float32)

    def save(self, path):
        """Write this network to one file at ``path``, for ``jaxflowers.load`` (MATLAB's
        ``save``); no pickle (see ``jaxflowers.saving.netfile``). Returns the path."""
        from jaxflowers.saving.netfile import save

        return save(self, path)


def load(path) -> TrainedNet:
    """Read a network that ``TrainedNet.save`` wrote (MATLAB's ``load`` of a saved net).

    Args:
      path: the file.

    Returns:
      The ``TrainedNet``; it predicts exactly as the saved one did.

    Raises:
      FileNotFoundError: nothing at ``path``. IsADirectoryError: ``path`` is a folder.
      ValueError: the file is not a saved network, is damaged, or comes from a newer
        version of jaxflowers; the message names the file.
    """
    from jaxflowers.saving.netfile import read

    return read(path, TrainedNet)
