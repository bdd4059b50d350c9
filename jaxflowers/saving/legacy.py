"""Networks saved by jaxflowers 0.1 (a zip of ``net.json`` and ``arrays.msgpack``), read only.

They are read into the current plain form (``TrainedNet.to_dict``'s); saving writes the new one.
"""
from __future__ import annotations

import json
import pathlib
import zipfile

__all__ = ["read_v1"]

_TAG, _TUPLE, _ARRAY = "__jaxflowers_tag__", "__jaxflowers_tuple__", "__jaxflowers_array__"


def read_v1(path: pathlib.Path) -> dict:
    """The plain form of a version-1 file; ``ValueError`` naming it if it is not one."""
    from flax import serialization

    try:
        with zipfile.ZipFile(path) as archive:
            meta = json.loads(archive.read("net.json"))
            stored = serialization.msgpack_restore(archive.read("arrays.msgpack"))
        if meta.get("format") != "jaxflowers.TrainedNet" or meta.get("version") != 1:
            raise ValueError("its net.json does not describe a version-1 network")
        fields = _decode(meta["fields"], stored.get("arrays", {}))
        return {**_model(fields["model"]), "variables": stored["variables"],
                "class_names": list(fields["class_names"]),
                "normalization": list(fields["normalization"]),
                "input_shape": list(fields["input_shape"])}
    except Exception as error:  # noqa: BLE001 (zipfile, msgpack and JSON raise many types)
        raise ValueError(f"cannot load {path}: a zip file, but not an intact network of "
                         f"jaxflowers 0.1 ({type(error).__name__}: {error})") from None


def _decode(tree, arrays):
    if isinstance(tree, list):
        return [_decode(v, arrays) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if _ARRAY in tree:
        return arrays[tree[_ARRAY]]
    if _TUPLE in tree:
        return [_decode(v, arrays) for v in tree[_TUPLE]]
    if _TAG in tree:
        return {"tag": tree[_TAG], **_decode(tree["value"], arrays)}
    return {k: _decode(v, arrays) for k, v in tree.items()}


def _model(module: dict) -> dict:
    """The ``model`` spec and ``dtype`` of a 0.1 module description."""
    fields = module["fields"]
    dtype = (fields.get("dtype") or {}).get("name", "float32")
    if module["class"] == "CifarNet":
        kwargs = {k: fields[k] for k in ("depth", "num_classes", "dense_init") if k in fields}
        return {"model": ["cifar_net", kwargs], "dtype": dtype}
    if module["class"] == "ResNet":
        block = {"BasicBlock": "basic", "BottleneckBlock": "bottleneck"}[
            fields["block_cls"]["class"]]
        kwargs = {"stage_sizes": list(fields["stage_sizes"]), "block": block,
                  **{k: fields[k] for k in ("num_classes", "num_filters", "stem") if k in fields}}
        return {"model": ["resnet", kwargs], "dtype": dtype}
    raise ValueError(f"model class {module['class']!r} is not a network of jaxflowers 0.1")
