"""Sets of XLA's autotuning results, packed on one GPU and copied into other runs' caches.

A cold compile on a GPU spends most of its time timing cuDNN's convolution candidates one after
another. XLA keeps each choice in a per-fusion autotune folder inside JAX's compilation cache,
keyed by the instruction and the GPU's description. A set packs that folder as one GPU left
it, with the jaxlib, CUDA plugin and cuDNN it was timed under; before anything compiles, the
sets that match this installation are copied into the folder, so a fresh machine (a cluster's
other nodes, a CI runner, a new cache) starts with those choices. A set that does not match is
left alone, and a choice that is not in it is timed as before. The package's own sets live in
``autotune_results/``; ``JAXFLOWERS_AUTOTUNE_RESULTS`` names another folder of sets, or is
``off``. ``python -m jaxflowers.compilation.autotune pack CACHE`` makes a set on the GPU.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import os
import pathlib
import re
import secrets
import sys
import zipfile

__all__ = ["FOLDER", "RESULTS_ENV", "SHIPPED", "installed_software", "main", "pack", "seed",
           "set_name"]

FOLDER = "xla_gpu_per_fusion_autotune_cache_dir"  # JAX's name for it inside the cache folder
RESULTS_ENV = "JAXFLOWERS_AUTOTUNE_RESULTS"  # "off", or a folder of sets
SHIPPED = pathlib.Path(__file__).with_name("autotune_results")
MANIFEST = "manifest.json"
_DEVICE = re.compile(r'device_str:\s*"([^"]*)"')


def installed_software() -> dict | None:
    """The versions an autotuning result depends on; None without a pip-installed CUDA stack.

    XLA keys its results by instruction and GPU only, so a cuDNN engine chosen under one
    cuDNN must not be handed to another: the set records all three versions.
    """
    found = {}
    for role, names in (("jaxlib", ("jaxlib",)),
                        ("plugin", ("jax-cuda12-plugin", "jax-cuda13-plugin")),
                        ("cudnn", ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13"))):
        for name in names:
            try:
                found[role] = f"{name}=={importlib.metadata.version(name)}"
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        else:
            return None
    return found


def _sets(setting: str) -> list[pathlib.Path]:
    """The sets in the folder ``JAXFLOWERS_AUTOTUNE_RESULTS`` names, else the shipped ones."""
    folder = SHIPPED if not setting or setting.lower() == "off" else pathlib.Path(setting)
    return sorted(folder.glob("*.zip")) if folder.is_dir() else []


def _is_entry(name: str) -> bool:
    """A file of XLA's in the folder: relative, not hidden, outside its ``tmp/``."""
    parts = name.split("/")
    return "tmp" not in parts[:-1] and all(
        p and not p.startswith(".") and "\\" not in p for p in parts)


def _entries(source: pathlib.Path) -> list[str]:
    """The files XLA wrote under ``source`` (its layout is its own: every file is kept, with
    its relative path, but for half-written ones), sorted."""
    found = (p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
    return sorted(name for name in found if _is_entry(name))


def pack(source: str | os.PathLike, dest: str | os.PathLike, *, device_kind: str,
         software: dict | None = None) -> pathlib.Path:
    """Pack the autotune folder ``source`` into the set ``dest`` (a zip with a manifest).

    Args:
      source: an ``xla_gpu_per_fusion_autotune_cache_dir`` folder, or a compilation cache
        folder that holds one.
      dest: the zip file to write.
      device_kind: the GPU the results were timed on (``jax.devices()[0].device_kind``).
      software: the versions they were timed under; default: this installation's.

    Returns:
      ``dest`` as a Path.
    """
    source = pathlib.Path(source)
    if (source / FOLDER).is_dir():
        source = source / FOLDER
    if not source.is_dir():
        raise FileNotFoundError(f"{source}: no such folder of autotuning results")
    entries = _entries(source)
    if not entries:
        raise ValueError(f"{source} holds no autotuning results: run a "
                         "training with the compilation cache on, on the GPU, first")
    software = software or installed_software()
    if software is None:
        raise RuntimeError("no pip-installed jaxlib, CUDA plugin and cuDNN here: give software=")
    digest, devices, folders = hashlib.sha256(), {}, {}
    for entry in entries:
        if "/" in entry:  # XLA 0.11 keeps a GPU's results in a folder named by its fingerprint
            top = entry.split("/")[0]
            folders[top] = folders.get(top, 0) + 1
        text = (source / entry).read_bytes()
        digest.update(entry.encode() + b"\0" + text + b"\0")
        for device in _DEVICE.findall(text.decode(errors="replace")):
            devices[device] = devices.get(device, 0) + 1
    manifest = {"software": software, "device_kind": device_kind, "entries": len(entries),
                "device_descriptions": devices, "device_folders": folders,
                "digest": digest.hexdigest(),
                "created": datetime.date.today().isoformat()}
    dest = pathlib.Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{secrets.token_hex(4)}")
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(MANIFEST, json.dumps(manifest, indent=1) + "\n")
            for entry in entries:
                archive.write(source / entry, entry)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _read_set(path: pathlib.Path) -> tuple[dict, zipfile.ZipFile]:
    archive = zipfile.ZipFile(path)
    try:
        manifest = json.loads(archive.read(MANIFEST))
        names = [n for n in archive.namelist() if n != MANIFEST]
        bad = [n for n in names if not _is_entry(n)]
        if bad or len(names) != manifest["entries"] or "software" not in manifest:
            raise ValueError(f"unexpected members {bad[:3]} or counts")
    except Exception:
        archive.close()
        raise
    return manifest, archive


def seed(cache_folder: str | os.PathLike) -> int:
    """Copy the sets that match this installation into ``cache_folder``'s autotune folder.

    Entries already there are kept (XLA's own, or an earlier copy). Each copied file is
    written beside its place and renamed, so a killed process leaves whole files only; a
    marker per set makes later starts skip it at the cost of two ``stat`` calls.

    Args:
      cache_folder: JAX's compilation cache folder.

    Returns:
      How many entries were copied (0 when off, when nothing matches or all are there).

    Raises:
      FileNotFoundError: ``JAXFLOWERS_AUTOTUNE_RESULTS`` names no folder
        (``enable_compilation_cache`` turns it into a warning).
    """
    setting = os.environ.get(RESULTS_ENV, "")
    if setting.lower() == "off":
        return 0
    if setting and not os.path.isdir(setting):  # a typo would otherwise go unnoticed
        raise FileNotFoundError(f"{RESULTS_ENV}={setting}: no such folder of autotuning sets "
                                "(or set it to off)")
    target = pathlib.Path(cache_folder) / FOLDER
    pending = [(s, target / _marker(s)) for s in _sets(setting)]
    pending = [(s, marker) for s, marker in pending if not marker.exists()]
    software = installed_software() if pending else None
    copied = 0
    for path, marker in pending if software else []:
        try:
            manifest, archive = _read_set(path)
        except Exception as error:  # a damaged set costs its results, never the training
            print(f"jaxflowers: skipping autotuning results {path}: {error}", file=sys.stderr)
            continue
        with archive:
            if manifest["software"] != software:
                continue
            target.mkdir(parents=True, exist_ok=True)
            for name in archive.namelist():
                place = target / name
                if name == MANIFEST or place.exists():
                    continue
                place.parent.mkdir(parents=True, exist_ok=True)
                tmp = place.with_name(f".{place.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
                tmp.write_bytes(archive.read(name))
                os.replace(tmp, place)
                copied += 1
        marker.write_text(manifest["digest"] + "\n")
    return copied


def _marker(path: pathlib.Path) -> str:
    """The name of the file that says a set was copied: a set replaced (a new release, a
    repack) has another size or time, so it is looked at again."""
    stat = path.stat()
    return f".jaxflowers-{path.stem}-{stat.st_size}-{stat.st_mtime_ns}"


def set_name(device_kind: str, software: dict) -> str:
    """A set's file name: the GPU and the three versions, e.g. ``nvidia-h200_jaxlib-0.11.2...``."""
    parts = [device_kind] + [v.replace("==", "-") for v in software.values()]
    return "_".join(re.sub(r"[^a-z0-9.]+", "-", p.lower()).strip("-") for p in parts) + ".zip"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxflowers.compilation.autotune",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="pack a cache's results for this GPU into a set")
    packing.add_argument("cache", help="a compilation cache folder (or its autotune folder)")
    packing.add_argument("--out", help="folder for the set (default: the shipped sets' folder)")
    commands.add_parser("list", help="the sets, and which one matches this installation")
    args = parser.parse_args(argv)
    if args.command == "pack":
        import jax
        kind = jax.devices()[0].device_kind
        software = installed_software()
        if software is None or jax.default_backend() != "gpu":
            parser.error("pack runs on the GPU whose results they are, with JAX's CUDA wheels")
        dest = pathlib.Path(args.out or SHIPPED) / set_name(kind, software)
        print(pack(args.cache, dest, device_kind=kind, software=software))
        return 0
    mine = installed_software()
    print(f"this installation: {mine or 'no pip-installed CUDA plugin and cuDNN'}")
    for path in _sets(os.environ.get(RESULTS_ENV, "")):
        manifest, archive = _read_set(path)
        archive.close()
        match = "matches" if manifest["software"] == mine else "does not match"
        folders = ", ".join(manifest.get("device_folders", {}))
        print(f"{path.name}: {manifest['entries']} results, {manifest['device_kind']}"
              f"{f' (folders: {folders})' if folders else ''}, {match}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
