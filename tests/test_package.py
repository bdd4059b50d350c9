"""The packages load their names on first use (jaxflowers.host.lazy) and import no JAX early."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROGRAM = """
import sys
import jaxflowers as jf
import jaxflowers.data as data
assert "jax" not in sys.modules, "import jaxflowers imported jax"
assert data.ImageFolder.__name__ == "ImageFolder" and "jax" not in sys.modules
assert "ImageFolder" in dir(data) and "train" in dir(jf) and "sweep" in dir(jf)
# Binds the submodule on the package: jf.train must stay the function.
import jaxflowers.training.run
assert callable(jf.train) and jf.train.__module__ == "jaxflowers.training.run"
assert jf.models.resnet50 is jf.models.resnet50
try:
    jf.no_such_name
except AttributeError as error:
    assert "no_such_name" in str(error)
else:
    raise AssertionError("no AttributeError")
print("ok")
"""


def test_names_load_on_first_use_and_jax_only_when_needed():
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]

