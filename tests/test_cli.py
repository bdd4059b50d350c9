"""End to end: the README's main job, as a newcomer runs it, on the embedded digits."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_main_job_trains_on_embedded_digits_to_95_percent(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg",
               XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=str(ROOT), JAXFLOWERS_COMPILE_CACHE=str(tmp_path / "xla"))
    result = subprocess.run([sys.executable, "-m", "jaxflowers", "train"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "Training on 4 cpu devices" in out  # every local device
    assert re.search(r"\|\s+15 \|\s+180 \|", out)  # the table reached epoch 15, iteration 180
    accuracy = float(re.search(r"Test accuracy: ([\d.]+)% \(\d+ images\)", out).group(1))
    assert accuracy >= 95.0, out[-2000:]
    # Where the process's time went, each part once.
    parts = re.search(r"Seconds: JAX start-up ([\d.]+), data ([\d.]+), placing and initialising "
                      r"([\d.]+), compile ([\d.]+), training ([\d.]+), prediction ([\d.]+)", out)
    assert parts and float(parts[5]) > 0 and float(parts[4]) > 0, out[-2000:]
    assert any((tmp_path / "xla").iterdir())  # compiled programs kept for the next run


def test_cli_rejects_unknown_model():
    result = subprocess.run([sys.executable, "-m", "jaxflowers", "train", "--model", "vgg"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "invalid choice: 'vgg'" in result.stderr


def test_readme_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for marker in ("SETUP", "TEST"):
        command = re.search(rf"^{marker}='(.+)'$", ci, re.M).group(1)
        assert f"\n{command}\n" in readme, f"README lacks the {marker} command {command!r}"
