"""The benchmarks that compare package trees run each tree's package, whatever folder they are
started from: ``python -m`` and ``python -c`` put the current folder before ``PYTHONPATH``."""
import importlib.util
import pathlib
import sys

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
