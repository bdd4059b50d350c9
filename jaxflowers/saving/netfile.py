"""A trained network on disk: ``TrainedNet.save(path)`` and ``jaxflowers.load(path)``.

One zip file (stored, not compressed; every member carries a CRC-32, so damage is found
on reading) holding two members and no pickle:

* ``net.json``: the format and version, and every field of the ``TrainedNet`` but its
  variables, as ``jaxflowers.saving.plaintree`` encodes them (the model as its class and fields, only
  classes of ``jaxflowers.models`` rebuilt);
* ``arrays.msgpack``: the variables and the codec's arrays (the normalization), through
  ``flax.serialization``.

The file is written beside its destination and renamed into place, so a crash while
saving leaves the previous file (or none), never half of one.
"""
from __future__ import annotations

import json
import os
import pathlib
import secrets
import zipfile

FORMAT = "jaxflowers.TrainedNet"
VERSION = 1
_META, _ARRAYS = "net.json", "arrays.msgpack"


def save(net, path: str | os.PathLike) -> pathlib.Path:
    """Write ``net`` to the file ``path`` (its folder is created if missing); see the module.

    Returns:
      ``path`` as a ``pathlib.Path``.
    """
    import dataclasses

    from flax import serialization

    from jaxflowers.saving import plaintree as codec

    path = pathlib.Path(path).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"cannot save the network to {path}: it is a folder; give a "
                                "file name such as net.zip")
    arrays: dict = {}
    fields = {f.name: getattr(net, f.name) for f in dataclasses.fields(net)
              if f.init and f.name != "variables"}
    try:
        encoded = codec.encode_tree(fields, arrays, what="the network")
    except TypeError as error:
        raise TypeError(f"cannot save the network to {path}: {error}. Only the models of "
                        "jaxflowers.models are saved (as their class and fields, without "
                        "pickle)") from error
    meta = {"format": FORMAT, "version": VERSION, "fields": encoded}
    blob = serialization.msgpack_serialize({"variables": net.variables, "arrays": arrays})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr(_META, json.dumps(meta, indent=1))
            archive.writestr(_ARRAYS, blob)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read(path: str | os.PathLike, build):
    """Read a network that ``TrainedNet.save`` wrote and hand its fields to ``build``.

    Args:
      path: the file.
      build: called with the network's fields as keyword arguments (``TrainedNet``).

    Returns:
      What ``build`` returns.

    Raises:
      FileNotFoundError: nothing at ``path``. IsADirectoryError: ``path`` is a folder.
      ValueError: the file is not a saved network, is damaged, or comes from a newer
        version of jaxflowers; the message names the file.
    """
    path = pathlib.Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no saved network at {path}")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a saved network file")
    meta, blob = _read_members(path)
    try:
        fields, variables = _decode(meta, blob)
        return build(variables=variables, **fields)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} is damaged or not a saved jaxflowers network: "
                         f"{type(error).__name__}: {error}") from error


def _read_members(path: pathlib.Path) -> tuple[dict, bytes]:
    """(the parsed ``net.json``, the bytes of ``arrays.msgpack``), checked."""
    try:
        with zipfile.ZipFile(path) as archive:
            meta = json.loads(archive.read(_META))
            if not (isinstance(meta, dict) and meta.get("format") == FORMAT):
                raise ValueError(f"its {_META} does not describe a {FORMAT}")
            if meta.get("version") != VERSION:
                raise ValueError(f"it has format version {meta.get('version')!r}; this "
                                 f"jaxflowers reads version {VERSION} (a newer jaxflowers "
                                 "wrote it?)")
            return meta, archive.read(_ARRAYS)
    except zipfile.BadZipFile as error:  # not a zip, truncated, or a member's CRC fails
        reason = f"damaged or not a saved network ({error})"
    except KeyError as error:  # a member is missing
        reason = f"not a saved network: {error.args[0]}"
    except (ValueError, UnicodeDecodeError) as error:
        reason = f"not a saved network: {error}"
    raise ValueError(f"cannot load {path}: {reason}")


def _decode(meta: dict, blob: bytes) -> tuple[dict, dict]:
    """(the TrainedNet's fields but its variables, the variables) of a file's contents."""
    from flax import serialization

    from jaxflowers.saving import plaintree as codec

    stored = serialization.msgpack_restore(blob)
    fields = codec.rebuild_tagged(codec.decode_tree(meta["fields"],
                                                    stored.get("arrays", {}).__getitem__))
    return fields, stored["variables"]
