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



def _public_api(path: pathlib.Path):
    """(names in ``__all__`` or None, names the module binds, public functions and classes it
    defines) of a module's source; a lazy_loader ``__all__`` counts as complete."""
    import ast

    tree = ast.parse(path.read_text())
    listed, bound, defined = None, set(), set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
            if not node.name.startswith("_"):
                defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                bound.update(n.id for n in names if isinstance(n, ast.Name))
                if any(isinstance(n, ast.Name) and n.id == "__all__" for n in names):
                    listed = (set(ast.literal_eval(node.value)) if isinstance(target, ast.Name)
                              else "lazy")
    return listed, bound, defined


def test_every_module_declares_its_public_names():
    """``__all__`` everywhere: it names only what the module has, and every public function or
    class the module defines (so ``from m import *`` and the docs see exactly the API)."""
    for path in sorted((ROOT / "jaxflowers").rglob("*.py")):
        if path.name == "__main__.py":
            continue
        listed, bound, defined = _public_api(path)
        where = path.relative_to(ROOT)
        assert listed is not None, f"{where} has no __all__"
        if listed == "lazy":
            continue
        assert listed <= bound, f"{where}: __all__ names {sorted(listed - bound)}, not there"
        assert defined <= listed, f"{where}: {sorted(defined - listed)} missing from __all__"
