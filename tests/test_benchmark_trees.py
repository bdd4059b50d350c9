"""The benchmarks that compare package trees run each tree's package, whatever folder they are
started from: ``python -m`` and ``python -c`` put the current folder before ``PYTHONPATH``."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _package(folder: pathlib.Path, status: int) -> pathlib.Path:
    """A fake ``jaxflowers`` in ``folder`` whose ``python -m jaxflowers`` exits with ``status``."""
    (folder / "jaxflowers").mkdir(parents=True)
    (folder / "jaxflowers" / "__init__.py").write_text("")
    (folder / "jaxflowers" / "__main__.py").write_text(f"raise SystemExit({status})\n")
    return folder


def test_compile_log_runs_the_named_tree_from_a_folder_holding_another(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("compile_log",
                                                  ROOT / "benchmarks" / "compile_log.py")
    compile_log = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compile_log)
    tree = _package(tmp_path / "tree", 0)
    monkeypatch.chdir(_package(tmp_path / "here", 7))
    row = compile_log.run(str(tree), [sys.executable, "-m", "jaxflowers"], str(tmp_path))
    assert row["returncode"] == 0, "the current folder's package ran instead of the tree's"


def _package_trees():
    spec = importlib.util.spec_from_file_location("package_trees",
                                                  ROOT / "benchmarks" / "package_trees.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_tree_comes_first_on_the_path_and_the_installed_package_changes_nothing(tmp_path):
    trees = _package_trees()
    base = {"PYTHONPATH": os.pathsep.join(["/x", "", "/y"]), "OTHER": "1"}
    env = trees.environment(str(tmp_path / "t"), base)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "t"), "/x", "/y"]
    assert env["PYTHONSAFEPATH"] == "1" and env["OTHER"] == "1" and base["OTHER"] == "1"
    assert trees.environment("", base) == base
    assert trees.in_round(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert trees.in_round(["a", "b", "c"], 3) == ["c", "b", "a"]


SCRIPTS = ["bench_trees", "compile_log", "figure_time", "gpu_kernels", "solver_bits",
           "stream_startup", "trace_time"]


@pytest.mark.parametrize("spec, message", [
    ("{tmp}", "--tree {tmp}: expected LABEL=FOLDER"),
    ("a={tmp}", "--tree a={tmp}: no jaxflowers package in {tmp}"),
    ("a={pkg} --tree a={pkg}", "--tree a={pkg}: the label 'a' is given twice"),
])
def test_every_script_that_takes_trees_refuses_a_bad_one_by_name(tmp_path, spec, message):
    """Each refuses before it runs anything: exit 2 and one line naming the ``--tree``."""
    pkg = _package(tmp_path / "pkg", 0)
    fill = {"tmp": tmp_path, "pkg": pkg}
    args = [a.format(**fill) for a in f"--tree {spec}".split()]
    for script in SCRIPTS:
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *args],
                              capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert done.returncode == 2, (script, done.stderr[-2000:])
        assert done.stderr.strip().splitlines()[-1].endswith(message.format(**fill)), script
