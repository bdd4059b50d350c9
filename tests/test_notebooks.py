"""The notebooks run top to bottom in a real Jupyter kernel (nbclient), as a user runs them,
and are kept in git without outputs."""
import os
import pathlib
import re

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"


def run_notebook(name: str, cwd: pathlib.Path, report: str, **env) -> nbformat.NotebookNode:
    """Execute notebook ``name`` in a fresh python3 kernel started in ``cwd`` with ``env``
    added to this process's environment; a last cell prints ``report``'s value."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(f"print('REPORT', {report})"))
    environment = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # inline
    environment.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(NOTEBOOKS.parent), **env)
    client = NotebookClient(notebook, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    client.execute(env=environment)
    return notebook


def text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", ()) if o.output_type == "stream")


def images(cell) -> list:
    return [o for o in cell.get("outputs", ()) if "image/png" in o.get("data", {})]


def cell_running(notebook, code: str):
    return next(c for c in notebook.cells if c.cell_type == "code" and code in c.source)


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebooks_are_kept_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


@pytest.mark.slow
def test_multi_gpu_training_notebook_runs_and_learns(tmp_path):
    notebook = run_notebook("multi_gpu_training.ipynb", tmp_path, "accuracy",
                            XLA_FLAGS="--xla_force_host_platform_device_count=2",
                            JAXFLOWERS_NOTEBOOK_DATA="digits", JAXFLOWERS_NOTEBOOK_EPOCHS="6")
    accuracy = float(re.search(r"REPORT (\S+)", text(notebook.cells[-1])).group(1))
    assert accuracy >= 0.9
    training = cell_running(notebook, "jf.train(")
    assert len(images(training)) == 1  # the live view, updated in place to its last frame
    assert "final validation accuracy" in text(training)
    assert not (tmp_path / "training_progress.png").exists()  # in Jupyter: no file unasked


def test_notebooks_default_to_the_packaged_data_and_a_few_minutes_on_a_cpu():
    """One parameter cell: FULL = False takes the digits jaxflowers ships (no path into the
    repository or beside it) and a short run; FULL = True is the MATLAB recipe."""
    for name, full in (("multi_gpu_training.ipynb", ('"flowers"', "80")),
                       ("parallel_sweep.ipynb", ('"cifar10"', "30"))):
        cells = [c.source for c in nbformat.read(NOTEBOOKS / name, as_version=4).cells
                 if c.cell_type == "code"]
        first = cells[0]
        assert "FULL = False" in first and all("FULL =" not in c for c in cells[1:])
        assert f"({full[0]} if FULL else \"digits\")" in first
        assert f"{full[1]} if FULL else" in first
        assert not any("pathlib" in c or "shared" in c or "__file__" in c for c in cells)


@pytest.mark.slow
def test_parallel_sweep_notebook_runs_every_step(tmp_path):
    """On its offline default, the digits the package ships; for time, two depths of one
    epoch each (two jobs at once on CPU slots, the cancelled one beside them), compiled at
    LLVM -O0 as the sweep tests' jobs, whose programs these are."""
    notebook = run_notebook("parallel_sweep.ipynb", tmp_path, "accuracy",
                            XLA_FLAGS="--xla_force_host_platform_device_count=1 "
                                      "--xla_backend_optimization_level=0",
                            JAXFLOWERS_NOTEBOOK_EPOCHS="1", JAXFLOWERS_NOTEBOOK_DEPTHS="1 2")
    assert re.search(r"^data: digits; 1 epoch", text(notebook.cells[1]), re.M)
    assert len(images(cell_running(notebook, "sweep_progress("))) == 1  # the live grid
    fetched = text(cell_running(notebook, "fetch_outputs("))
    assert re.findall(r"depth (\d): final validation accuracy", fetched) == ["1", "2"]
    assert "cancelled: True True" in text(cell_running(notebook, "extra.cancel()"))
    tested = cell_running(notebook, "confusion_chart(")
    assert re.search(r"test accuracy of depth \d: [\d.]+% \(180 images\)", text(tested))
    assert len(images(tested)) == 1  # the confusion chart, shown inline
    accuracy = float(re.search(r"REPORT (\S+)", text(notebook.cells[-1])).group(1))
    assert accuracy > 0.15  # ten classes, chance is 0.1; one epoch reaches about 0.24


def html(cell) -> list:
    return [o for o in cell.get("outputs", ()) if "text/html" in o.get("data", {})]


@pytest.mark.slow
def test_experiment_notebook_runs_a_small_random_search_and_resumes(tmp_path):
    """Four trials of one epoch on the digits (two CPU slots), pruned by the median; then
    the same experiment again, which finds nothing left to run."""
    notebook = run_notebook("experiment.ipynb", tmp_path, "result.test_accuracy",
                            XLA_FLAGS="--xla_backend_optimization_level=0",
                            JAXFLOWERS_NOTEBOOK_TRIALS="4", JAXFLOWERS_NOTEBOOK_EPOCHS="1")
    running = cell_running(notebook, "experiment.run(devices")
    assert len(images(running)) == 1  # the live view, updated in place to its last frame
    assert len(html(running)) == 1  # the results table, updated in place
    assert html(cell_running(notebook, "table = result.table"))
    assert images(cell_running(notebook, "parameter_chart("))
    best = cell_running(notebook, "best = result.best")
    assert re.search(r"test accuracy [\d.]+%", text(best)) and len(images(best)) == 1
    again = text(cell_running(notebook, "again = experiment.run("))
    assert "ran 0 trial(s) this time; 4 in the table" in again
    assert (tmp_path / "experiment" / "experiment.db").is_file()
    accuracy = float(re.search(r"REPORT (\S+)", text(notebook.cells[-1])).group(1))
    assert 0.0 <= accuracy <= 100.0
