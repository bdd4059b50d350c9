"""The notebooks run top to bottom (their code cells, in order, in one namespace)."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"

RUNNER = textwrap.dedent("""
    import json, sys
    cells = json.load(open(sys.argv[1]))["cells"]
    namespace = {"__name__": "__main__"}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), sys.argv[1], "exec"), namespace)
    acc = namespace.get("accuracy")
    print("NOTEBOOK_ACCURACY", acc)
""")


@pytest.mark.slow
def test_multi_gpu_training_notebook_runs_and_learns(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAXFLOWERS_NOTEBOOK_DATA="digits", JAXFLOWERS_NOTEBOOK_EPOCHS="8",
               PYTHONPATH=str(NOTEBOOKS.parent))
    notebook = NOTEBOOKS / "multi_gpu_training.ipynb"
    result = subprocess.run([sys.executable, "-c", RUNNER, str(notebook)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = float(result.stdout.split("NOTEBOOK_ACCURACY")[1])
    assert accuracy >= 0.9, result.stdout[-2000:]
