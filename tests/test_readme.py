"""The README's Python snippets run as written, on a CPU, and print what they say."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SNIPPETS = re.findall(r"^```python\n(.*?)^```$", (ROOT / "README.md").read_text(), re.M | re.S)


def run_snippet(code: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    """``code`` in a fresh Python in ``cwd``, as a user pastes it into a script (CPU, two
    devices, no display)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg", PYTHONPATH=str(ROOT),
               XLA_FLAGS="--xla_force_host_platform_device_count=2 "
                         "--xla_backend_optimization_level=0")
    env.pop("JAX_NUM_CPU_DEVICES", None)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_readme_has_its_snippets():
    """Two that run as written (training, the pool) and two that need what a CPU machine
    has not (a weights file; CIFAR-10 and GPUs)."""
    assert len(SNIPPETS) == 4
    assert "jf.train(" in SNIPPETS[0] and "DevicePool" in SNIPPETS[1]
    assert "jf.models.pretrained(" in SNIPPETS[2] and "jf.sweep.Experiment(" in SNIPPETS[3]


@pytest.mark.parametrize("index", range(4))
def test_every_snippet_is_python_and_names_only_what_the_package_has(index):
    """The snippets that cannot run here still parse, and every ``jf.a.b`` they name exists
    (a renamed function breaks this test, not a user's paste)."""
    import jaxflowers as jf

    code = SNIPPETS[index]
    compile(code, f"README snippet {index}", "exec")
    names = set(re.findall(r"\bjf((?:\.[A-Za-z_]\w*)+)", code))
    assert names
    for name in names:
        target = jf
        for part in name.strip(".").split("."):
            assert hasattr(target, part), f"README snippet {index}: jf{name} does not exist"
            target = getattr(target, part)


@pytest.mark.slow
def test_the_training_snippet_trains_tests_and_keeps_its_files(tmp_path):
    done = run_snippet(SNIPPETS[0], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "scale_for_devices: 2 devices: mini_batch_size 32 -> 64" in out
    test, validation = map(float, re.search(
        r"^test accuracy ([\d.]+)%, final validation accuracy ([\d.]+)%$", out, re.M).groups())
    assert 20 < test <= 100 and 20 < validation <= 100  # both percent: 10 classes, 2 epochs
    assert test == pytest.approx(validation, abs=0.06)  # the validation set is the test set
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "confusion.png", "digits.net", "training_progress.png"]
    assert "\r" not in done.stderr  # a log: no bar


@pytest.mark.slow
def test_the_sweep_snippet_reports_validations_cancels_and_shuts_its_pool(tmp_path):
    done = run_snippet(SNIPPETS[1], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for job in (0, 1):
        assert f"job {job}: start " in lines and f"job {job}: done " in lines
        assert any(re.fullmatch(rf"job {job}: validation [\d.]+%", line) for line in lines)
    assert "job 2: cancelled " in lines
    assert re.fullmatch(r"\['[\d.]+%', '[\d.]+%'\]", lines[-1])
    assert list(tmp_path.iterdir()) == []  # the pool keeps its logs elsewhere, and cleans up
