"""A script of ``benchmarks/`` imported as a module, for the tests that call its functions."""
import importlib.util
import pathlib

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    """The module of ``benchmarks/<name>.py``, freshly executed."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
