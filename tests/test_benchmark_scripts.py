"""The cold-start benchmark runs against the package as it is: its pieces compile the programs
``train`` builds (here for the sweep's network, on a tiny folder), so a change of their
signatures cannot leave it broken unnoticed."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
from image_folders import class_folders

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("piece", ["init", "all"])
def test_cold_start_compiles_each_piece_of_the_sweeps_network(tmp_path, piece):
    data = class_folders(tmp_path / "data", per_class=20, classes=("a", "b", "c"), size=(12, 10))
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAXFLOWERS_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cold_start.py"), piece, str(data),
         "--model", "cifar_net:1", "--per-device-batch", "4"],
        env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["piece"] == piece and row["model"] == "cifar_net:1"
    assert row["compile"]["wall_s"] > 0
