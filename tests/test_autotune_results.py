"""Shipped autotuning results: packed on a GPU, copied into the compilation cache only where
jaxlib, the CUDA plugin and cuDNN are the ones they were timed under."""
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from jaxflowers.compilation import autotune

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOFTWARE = {"jaxlib": "jaxlib==0.11.2", "plugin": "jax-cuda12-plugin==0.11.2",
            "cudnn": "nvidia-cudnn-cu12==9.10.2.21"}
DEVICE = "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz, Memory bandwidth: 4800 GB/s, L2 cache: 60 MB"


def _entry(i: int) -> str:
    return (f'key {{\n  hlo_fingerprint: "fp{i}"\n  device_str: "{DEVICE}"\n  version: 1\n}}\n'
            f'codegen_backend: "Cudnn"\nbackend_config {{ value: "engine {i}" }}\n')


NAMES = ["Ab-0_x=.textproto", "Ab-1_x=.textproto", "CUDA 9.0, v21/Ab-2_x=.pb"]


def _results(folder: pathlib.Path) -> pathlib.Path:
    """Three results, one in a subfolder as XLA may keep them; XLA's half-written one and a
    hidden file are not results."""
    for i, name in enumerate(NAMES):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(_entry(i))
    (folder / "tmp").mkdir()
    (folder / "tmp" / "tmp_per_fusion_cache_1.textproto").write_text("half")
    (folder / ".lock").write_text("")
    return folder


@pytest.fixture
def sets(tmp_path, monkeypatch):
    """A folder holding one set packed under SOFTWARE, named by RESULTS_ENV."""
    source = _results(tmp_path / "gpu-cache" / autotune.FOLDER)
    folder = tmp_path / "sets"
    autotune.pack(source.parent, folder / autotune.set_name("NVIDIA H200", SOFTWARE),
                  device_kind="NVIDIA H200", software=SOFTWARE)
    monkeypatch.setenv(autotune.RESULTS_ENV, str(folder))
    return folder


def test_pack_then_seed_copies_every_result_once(sets, tmp_path, monkeypatch):
    (zipped,) = sets.iterdir()
    assert zipped.name == ("nvidia-h200_jaxlib-0.11.2_jax-cuda12-plugin-0.11.2_"
                           "nvidia-cudnn-cu12-9.10.2.21.zip")
    manifest = json.loads(zipfile.ZipFile(zipped).read("manifest.json"))
    assert manifest["entries"] == 3 and manifest["software"] == SOFTWARE
    assert manifest["device_descriptions"] == {DEVICE: 3}
    assert manifest["device_folders"] == {"CUDA 9.0, v21": 1}
    monkeypatch.setattr(autotune, "installed_software", lambda: SOFTWARE)
    cache = tmp_path / "xla"
    target = cache / autotune.FOLDER
    target.mkdir(parents=True)
    (target / NAMES[1]).write_text("XLA's own")  # kept, not overwritten
    assert autotune.seed(cache) == 2
    assert (target / NAMES[1]).read_text() == "XLA's own"
    for i in (0, 2):
        assert (target / NAMES[i]).read_text() == _entry(i)
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")
                  if p.is_file() and not p.name.startswith(".jaxflowers-")) == NAMES  # whole
    (target / NAMES[0]).unlink()
    assert autotune.seed(cache) == 0  # the marker: a later start does not copy again
    source = tmp_path / "gpu-cache" / autotune.FOLDER
    (source / "new.textproto").write_text(_entry(3))
    autotune.pack(source, zipped, device_kind="NVIDIA H200", software=SOFTWARE)  # a new release
    assert autotune.seed(cache) == 2  # looked at again: the new result and the one removed
    assert (target / "new.textproto").read_text() == _entry(3)


@pytest.mark.parametrize("change", ["jaxlib", "cudnn", "no CUDA stack", "off"])
def test_nothing_is_copied_for_other_software_or_when_off(sets, tmp_path, monkeypatch, change):
    mine = dict(SOFTWARE)
    if change == "jaxlib":
        mine["jaxlib"] = "jaxlib==0.11.3"
    elif change == "cudnn":
        mine["cudnn"] = "nvidia-cudnn-cu12==9.12.0.46"
    elif change == "off":
        monkeypatch.setenv(autotune.RESULTS_ENV, "off")
    monkeypatch.setattr(autotune, "installed_software",
                        lambda: None if change == "no CUDA stack" else mine)
    assert autotune.seed(tmp_path / "xla") == 0
    assert not (tmp_path / "xla").exists()


@pytest.mark.parametrize("damage", ["truncated", "path outside", "count"])
def test_a_damaged_set_is_skipped_with_its_name_and_the_rest_copied(
        sets, tmp_path, monkeypatch, capfd, damage):
    (good,) = sets.iterdir()
    bad = sets / "bad.zip"
    if damage == "truncated":
        bad.write_bytes(good.read_bytes()[:200])
    else:
        with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
            manifest = json.loads(src.read("manifest.json"))
            if damage == "count":
                manifest["entries"] += 1
            dst.writestr("manifest.json", json.dumps(manifest))
            for name in src.namelist()[1:]:
                dst.writestr(("../" if damage == "path outside" else "") + name, src.read(name))
    monkeypatch.setattr(autotune, "installed_software", lambda: SOFTWARE)
    assert autotune.seed(tmp_path / "xla") == 3  # the good set's
    assert str(bad) in capfd.readouterr().err
    target = tmp_path / "xla" / autotune.FOLDER
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")
                  if p.is_file() and not p.name.startswith(".")) == NAMES


def test_a_missing_folder_of_sets_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(autotune.RESULTS_ENV, str(tmp_path / "typo"))
    with pytest.raises(FileNotFoundError, match="JAXFLOWERS_AUTOTUNE_RESULTS=.*typo"):
        autotune.seed(tmp_path / "xla")


def test_pack_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        autotune.pack(tmp_path / "nowhere", tmp_path / "s.zip", device_kind="x", software=SOFTWARE)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty holds no autotuning results"):
        autotune.pack(tmp_path / "empty", tmp_path / "s.zip", device_kind="x", software=SOFTWARE)
    assert not (tmp_path / "s.zip").exists()


def test_list_says_which_set_matches(sets, monkeypatch, capsys):
    monkeypatch.setattr(autotune, "installed_software", lambda: SOFTWARE)
    assert autotune.main(["list"]) == 0
    assert "3 results, NVIDIA H200 (folders: CUDA 9.0, v21), matches" in capsys.readouterr().out
    monkeypatch.setattr(autotune, "installed_software", lambda: None)
    autotune.main(["list"])
    out = capsys.readouterr().out
    assert "no pip-installed CUDA plugin" in out and "does not match" in out


def test_pack_from_the_command_line_needs_the_gpu(tmp_path, monkeypatch, capsys):
    source = _results(tmp_path / "cache" / autotune.FOLDER)
    monkeypatch.setattr(autotune, "installed_software", lambda: SOFTWARE)
    with pytest.raises(SystemExit):  # this machine's backend is the CPU
        autotune.main(["pack", str(source.parent), "--out", str(tmp_path / "sets")])
    assert "on the GPU whose results they are" in capsys.readouterr().err
    assert not (tmp_path / "sets").exists()


PROGRAM = """
import sys, warnings
from jaxflowers.compilation import autotune
autotune.installed_software = lambda: {software!r}
import jaxflowers as jf
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(jf.enable_compilation_cache())
print(len(caught), *[str(w.message) for w in caught], file=sys.stderr)
"""


def _enable(tmp_path, sets, software=SOFTWARE):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               JAXFLOWERS_COMPILE_CACHE=str(tmp_path / "xla"),
               **{autotune.RESULTS_ENV: str(sets)})
    return subprocess.run([sys.executable, "-c", PROGRAM.format(software=software)], env=env,
                          capture_output=True, text=True, timeout=300)


def test_enabling_the_cache_copies_the_matching_set(sets, tmp_path):
    result = _enable(tmp_path, sets)
    assert result.returncode == 0 and result.stdout.strip() == str(tmp_path / "xla")
    assert result.stderr.startswith("0")  # no warning
    target = tmp_path / "xla" / autotune.FOLDER
    assert [(target / name).read_text() for name in NAMES] == [_entry(i) for i in range(3)]


def test_a_full_disk_leaves_the_cache_on_with_a_warning(sets, tmp_path):
    (tmp_path / "xla").mkdir()
    (tmp_path / "xla" / autotune.FOLDER).write_text("")  # the folder cannot be made there
    result = _enable(tmp_path, sets)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "xla")
    assert "could not copy autotuning results" in result.stderr


@pytest.mark.parametrize("path", sorted(autotune.SHIPPED.glob("*.zip")), ids=lambda p: p.name)
def test_shipped_sets_are_whole_and_say_what_they_are_for(path):
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        names = sorted(n for n in archive.namelist() if n != "manifest.json")
        digest = hashlib.sha256()
        devices = {}
        for name in names:
            text = archive.read(name)
            digest.update(name.encode() + b"\0" + text + b"\0")
            for device in autotune._DEVICE.findall(text.decode(errors="replace")):
                devices[device] = devices.get(device, 0) + 1
    assert set(manifest["software"]) == {"jaxlib", "plugin", "cudnn"}
    assert path.name == autotune.set_name(manifest["device_kind"], manifest["software"])
    assert len(names) == manifest["entries"] > 0 and digest.hexdigest() == manifest["digest"]
    assert all(autotune._is_entry(name) for name in names)
    assert devices == manifest["device_descriptions"]
    folders = [n.split("/")[0] for n in names if "/" in n]
    assert manifest["device_folders"] == {f: folders.count(f) for f in set(folders)}


@pytest.mark.parametrize("path", sorted(autotune.SHIPPED.glob("*.zip")), ids=lambda p: p.name)
def test_a_shipped_set_seeds_a_fresh_cache_on_its_own_versions(path, tmp_path, monkeypatch):
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        entries = {n: archive.read(n) for n in archive.namelist() if n != "manifest.json"}
    monkeypatch.delenv(autotune.RESULTS_ENV, raising=False)  # the package's own sets
    monkeypatch.setattr(autotune, "installed_software", lambda: manifest["software"])
    assert autotune.seed(tmp_path) == len(entries)
    target = tmp_path / autotune.FOLDER
    assert {name: (target / name).read_bytes() for name in entries} == entries
