"""A trained network as one file: safetensors, with its description in the header.

The header's ``jaxflowers`` JSON holds the version, registry spec, dtype, classes, input shape
and an xxh3-128 digest of every tensor, checked on reading (safetensors checks only the header).
No pickle: reading runs no code. Zip files of jaxflowers 0.1 are read by ``saving.legacy``.
"""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from jaxflowers.host.files import write_atomic

__all__ = ["FORMAT", "VERSION", "read", "write"]

FORMAT = "jaxflowers.TrainedNet"
VERSION = 2
_KEY = "jaxflowers"  # the header entry holding the description


def write(path: str | os.PathLike, plain: dict) -> pathlib.Path:
    """Write a network's plain form (``TrainedNet.to_dict``) to the file ``path``."""
    from safetensors.numpy import save

    path = pathlib.Path(path).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"cannot save the network to {path}: it is a folder; give a "
                                "file name such as net.safetensors")
    tensors = _flatten({"variables": plain["variables"],
                        "normalization": dict(enumerate(plain["normalization"]))})
    description = {key: plain[key] for key in plain if key not in ("variables", "normalization")}
    description.update(format=FORMAT, version=VERSION, digest=_digest(tensors))
    return write_atomic(path, save(tensors, metadata={_KEY: json.dumps(description)}))


def read(path: str | os.PathLike) -> dict:
    """The plain form of the network saved at ``path``.

    Raises:
      FileNotFoundError, IsADirectoryError: nothing, or a folder, at ``path``.
      ValueError: not a saved network, damaged, or of a newer format; naming the file.
    """
    path = pathlib.Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no saved network at {path}")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a saved network file")
    with open(path, "rb") as file:
        head = file.read(4)
    if head == b"PK\x03\x04":  # a zip: the format of jaxflowers 0.1
        from jaxflowers.saving import legacy
        return legacy.read_v1(path)
    tensors, description = _read_checked(path)
    nested = _unflatten(tensors)
    return {**{k: v for k, v in description.items() if k not in ("format", "version", "digest")},
            "variables": nested.get("variables", {}),
            "normalization": [nested["normalization"][str(i)] for i in range(2)]}


def _read_checked(path: pathlib.Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as file:
            description = json.loads((file.metadata() or {})[_KEY])
            tensors = {key: file.get_tensor(key) for key in file.keys()}
    except KeyError:
        raise ValueError(f"cannot load {path}: a safetensors file, but not a saved "
                         "jaxflowers network (its header has no description)") from None
    except Exception as error:  # noqa: BLE001 (safetensors raises its own types for damage)
        raise ValueError(f"cannot load {path}: damaged or not a saved network "
                         f"({type(error).__name__}: {error})") from None
    if not isinstance(description, dict) or description.get("format") != FORMAT:
        raise ValueError(f"cannot load {path}: its header does not describe a {FORMAT}")
    if description.get("version") != VERSION:
        raise ValueError(f"cannot load {path}: it has format version "
                         f"{description.get('version')!r}; this jaxflowers reads version "
                         f"{VERSION} (and 1); a newer jaxflowers wrote it?")
    if description.get("digest") != _digest(tensors):
        raise ValueError(f"cannot load {path}: its tensors do not match their digest (the file "
                         "is damaged)")
    return tensors, description


def _digest(tensors: dict) -> str:
    import xxhash

    digest = xxhash.xxh3_128()
    for key in sorted(tensors):
        array = np.ascontiguousarray(tensors[key])
        digest.update(f"{key}:{array.dtype.str}:{array.shape};".encode())
        digest.update(array.data)
    return digest.hexdigest()


def _flatten(tree, prefix: str = "") -> dict[str, np.ndarray]:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "/"))
        else:
            flat[name] = np.ascontiguousarray(value)
    return flat


def _unflatten(flat: dict) -> dict:
    tree: dict = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree
