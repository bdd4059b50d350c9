"""Networks that leave Python: ONNX (MATLAB's ``exportONNXNetwork``) and serialized StableHLO.

Both take what ``predict`` takes and give what it gives: uint8 images (B, H, W, C), NHWC,
RGB, any batch size B, in; float32 softmax scores (B, num_classes) out; the network's
normalisation (``TrainedNet.normalization``) is part of the program, so callers feed raw
pixels. The model runs in inference mode (batch norm with its stored statistics, the max
pool as plain slices and maxima), the weights are constants of the program.

* StableHLO (``jax.export``): the network's own compute dtype, a symbolic batch dimension.
  Any Python with JAX runs it without jaxflowers:
  ``jax.export.deserialize(open(path, "rb").read()).call(images)``.
* ONNX (``jax2onnx``, opset :data:`OPSET`): float32 (ONNX runtimes' bfloat16 convolutions
  are patchy), input "images" and output "scores" with a free batch dimension "batch".
"""
from __future__ import annotations

import contextlib
import logging
import os
import pathlib

import numpy as np

from jaxflowers.host.files import write_atomic

__all__ = ["export_onnx", "export_stablehlo", "scores_function"]

OPSET = 23  # ONNX operator set of export_onnx (onnxruntime >= 1.22 runs it)
FORMATS = ("onnx", "stablehlo")


def scores_function(net, dtype=None):
    """``images -> scores`` of ``net``: uint8 (B, H, W, C) to float32 softmax (B, classes).

    Args:
      net: a ``TrainedNet``.
      dtype: compute dtype (default: the network's).
    """
    import jax
    import jax.numpy as jnp

    from jaxflowers.data.augment import normalize

    model = net.model
    if dtype is not None and hasattr(model, "dtype"):
        model = model.clone(dtype=dtype)
    compute = getattr(model, "dtype", jnp.float32)
    variables = jax.tree.map(lambda v: np.asarray(v, np.float32), net.variables)
    mean, std = (np.asarray(s, np.float32) for s in net.normalization)

    def scores(images):
        x = normalize(images, mean, std, compute)
        logits = model.apply(variables, x, train=False).astype(jnp.float32)
        return jax.nn.softmax(logits, axis=-1)

    return scores


def export_stablehlo(net, path: str | os.PathLike) -> pathlib.Path:
    """Write ``net`` as a serialized ``jax.export.Exported`` (StableHLO) to ``path``.

    Returns:
      The path. ``jax.export.deserialize(bytes).call(images)`` runs it: uint8 (B, H, W, C)
      images of any B, float32 (B, num_classes) scores.
    """
    import jax
    import jax.numpy as jnp

    batch = jax.export.symbolic_shape("batch")
    spec = jax.ShapeDtypeStruct((*batch, *net.input_shape), jnp.uint8)
    exported = jax.export.export(jax.jit(scores_function(net)))(spec)
    return write_atomic(_target(path), bytes(exported.serialize()))


def export_onnx(net, path: str | os.PathLike, *, opset: int = OPSET) -> pathlib.Path:
    """Write ``net`` as an ONNX model to ``path`` (``exportONNXNetwork``), float32.

    Args:
      net: a ``TrainedNet``.
      path: the ``.onnx`` file.
      opset: the ONNX operator set.

    Returns:
      The path. Input "images": uint8 (batch, H, W, C); output "scores": float32
      (batch, num_classes) softmax scores, normalisation included.

    Raises:
      ImportError: jax2onnx is not installed (``pip install "jaxflowers[export]"``).
    """
    import jax
    import jax.numpy as jnp

    try:
        from jax2onnx import to_onnx
    except ImportError:
        raise ImportError("ONNX export needs jax2onnx: pip install 'jaxflowers[export]'") from None
    spec = jax.ShapeDtypeStruct(("batch", *net.input_shape), jnp.uint8)
    with _quiet("onnx_ir", "jax2onnx"):  # their per-node notes on value types
        model = to_onnx(scores_function(net, jnp.float32), [spec], opset=opset,
                        model_name="jaxflowers", input_names=["images"],
                        output_names=["scores"], return_mode="proto")
    return write_atomic(_target(path), model.SerializeToString())


def _target(path) -> pathlib.Path:
    path = pathlib.Path(path).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"cannot export to {path}: it is a folder; give a file name")
    return path


@contextlib.contextmanager
def _quiet(*names: str):
    """Within: these loggers report errors only."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
