"""The benchmarks that compare package trees run each tree's package, whatever folder they are
started from: ``python -m`` and ``python -c`` put the current folder before ``PYTHONPATH``."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
from benchmark_script import load

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _package(folder: pathlib.Path, status: int) -> pathlib.Path:
    """A fake ``jaxflowers`` in ``folder`` whose ``python -m jaxflowers`` exits with ``status``."""
    (folder / "jaxflowers").mkdir(parents=True)
    (folder / "jaxflowers" / "__init__.py").write_text("")
    (folder / "jaxflowers" / "__main__.py").write_text(f"raise SystemExit({status})\n")
    return folder


def test_compile_log_runs_the_named_tree_from_a_folder_holding_another(tmp_path, monkeypatch):
    compile_log = load("compile_log")
    tree = _package(tmp_path / "tree", 0)
    monkeypatch.chdir(_package(tmp_path / "here", 7))
    row = compile_log.run(str(tree), [sys.executable, "-m", "jaxflowers"], str(tmp_path))
    assert row["returncode"] == 0, "the current folder's package ran instead of the tree's"


def test_a_tree_comes_first_on_the_path_and_the_installed_package_changes_nothing(tmp_path):
    trees = load("package_trees")
    base = {"PYTHONPATH": os.pathsep.join(["/x", "", "/y"]), "OTHER": "1"}
    env = trees.environment(str(tmp_path / "t"), base)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "t"), "/x", "/y"]
    assert env["PYTHONSAFEPATH"] == "1" and env["OTHER"] == "1" and base["OTHER"] == "1"
    assert trees.environment("", base) == base
    assert trees.in_round(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert trees.in_round(["a", "b", "c"], 3) == ["c", "b", "a"]


SCRIPTS = ["bench_trees", "checkpoint_writes", "compile_log", "figure_time", "gpu_kernels",
           "solver_bits", "stream_startup", "trace_time"]


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


def _stub_tree(root, rate):
    """A folder holding a stub ``jaxflowers`` whose bench writes ``rate`` images/s (or fails
    for None) and the file it was imported from, as its device name."""
    bench = _package(root, 0) / "jaxflowers" / "bench"
    bench.mkdir()
    (bench / "__init__.py").write_text("")
    (bench / "__main__.py").write_text(
        "import json, os, sys\n"
        + ("sys.exit('no GPU')\n" if rate is None else "")
        + "args = sys.argv[1:]\n"
        "out = args[args.index('--out') + 1]\n"
        "batch = int(args[args.index('--per-device-batch') + 1])\n"
        "os.makedirs(out)\n"
        f"result = {{'images_per_s': {rate} * batch / 128, 'compile_s': 1.0}}\n"
        "env = {'devices': __file__}\n"
        "json.dump({'results': [result], 'environment': env},"
        " open(os.path.join(out, 'bench.json'), 'w'))\n")
    return root


def test_bench_trees_alternates_the_trees_and_imports_each_ones_package(tmp_path, capsys):
    script = load("bench_trees")
    old, new = _stub_tree(tmp_path / "old", 5000), _stub_tree(tmp_path / "new", 6000)
    broken = _stub_tree(tmp_path / "broken", None)
    rows = script.main(["--tree", f"old={old}", "--tree", f"new={new}", "--tree",
                        f"broken={broken}", "--batches", "128", "256", "--rounds", "2",
                        "--out", str(tmp_path / "rows.json")])
    assert [(r["round"], r["batch"], r["tree"]) for r in rows[:6]] == [
        (0, 128, "old"), (0, 128, "new"), (0, 128, "broken"),
        (0, 256, "old"), (0, 256, "new"), (0, 256, "broken")]
    assert [r["tree"] for r in rows[6:9]] == ["broken", "new", "old"]  # reversed in round 1
    by = {(r["tree"], r["batch"], r["round"]): r for r in rows}
    assert by["new", 256, 1]["images_per_s"] == 12000 and by["new", 256, 1]["step_ms"] == 21.33
    assert by["old", 128, 0]["device"] == str(old / "jaxflowers" / "bench" / "__main__.py")
    assert "no GPU" in by["broken", 128, 0]["error"]
    assert json.loads((tmp_path / "rows.json").read_text()) == rows
    assert "12000.0" in capsys.readouterr().out
    # past the budget nothing starts; a folder without the package is refused by name
    rows = script.main(["--tree", f"old={old}", "--budget", "-1"])
    assert all(r["error"] == "skipped: past --budget" for r in rows)
    with pytest.raises(SystemExit):
        script.main(["--tree", f"empty={tmp_path}"])
    assert f"--tree empty={tmp_path}: no jaxflowers package" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--tree", str(old)])
    assert f"--tree {old}: expected LABEL=FOLDER" in capsys.readouterr().err
