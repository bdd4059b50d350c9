"""``python -m jaxflowers export NET_FILE OUT [--format onnx|stablehlo]``: a saved network
(``--save`` of ``train``, ``TrainedNet.save``) as ONNX or serialized StableHLO
(``inference.export``)."""
from __future__ import annotations

import pathlib

from jaxflowers.inference.export import FORMATS  # imports no JAX

__all__ = ["add_parser", "run"]

_SUFFIXES = {".onnx": "onnx", ".stablehlo": "stablehlo", ".shlo": "stablehlo"}


def add_parser(commands, common) -> None:
    """Add the ``export`` subcommand (``common``: the parent parser of shared flags)."""
    export = commands.add_parser(
        "export", parents=[common], help="write a saved network as ONNX or StableHLO",
        description="uint8 images (batch, H, W, C) in, float32 softmax scores out, the "
                    "network's normalisation included")
    export.add_argument("net_file", metavar="NET_FILE", help="a saved network (train --save)")
    export.add_argument("out", metavar="OUT", help="the file to write")
    export.add_argument("--format", choices=FORMATS, default=None,
                        help="onnx (jax2onnx, float32, runs under onnxruntime) or stablehlo "
                             "(jax.export; JAX alone runs it) (default: from OUT's suffix, "
                             f"{', '.join(_SUFFIXES)})")


def run(args) -> int:
    """Run ``python -m jaxflowers export``; returns the exit status."""
    fmt = args.format or _SUFFIXES.get(pathlib.Path(args.out).suffix.lower())
    if fmt is None:
        raise ValueError(f"cannot tell the format of {args.out} from its suffix; give "
                         f"--format {' or '.join(FORMATS)}")
    import jaxflowers as jf

    net = jf.load(args.net_file)
    path = net.export_onnx(args.out) if fmt == "onnx" else net.export(args.out)
    print(f"{net!r} exported as {fmt} to {path}")
    return 0
