"""The code passes the project's ruff rules (pyproject.toml), so the README's test command
also lints."""
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    beside = pathlib.Path(sys.executable).with_name("ruff")
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    return [found]


def test_ruff_finds_nothing():
    result = subprocess.run([*_ruff(), "check", "--output-format", "concise",
                             "jaxflowers", "tests", "benchmarks"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_reports_a_planted_fault(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    result = subprocess.run([*_ruff(), "check", "--config", str(ROOT / "pyproject.toml"),
                             str(bad)], capture_output=True, text=True)
    assert result.returncode == 1 and "F401" in result.stdout, result.stdout
