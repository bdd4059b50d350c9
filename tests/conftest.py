"""Test set-up: four fake CPU devices, fixed before anything touches JAX."""
import atexit
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests compile many small programs and run each only a few steps: LLVM optimisation
# level 0 halves XLA:CPU compile time (measured 47 s -> 23 s for the equivalence test's
# ResNet) and changes no result beyond rounding.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=4"
                           " --xla_backend_optimization_level=0").strip()
os.environ["JAX_NUM_CPU_DEVICES"] = "4"
# One compilation cache for the test session, fresh each time and removed at exit: the
# many trainings of the same small networks, in this process and in the CLI, sweep and
# script processes the tests start, compile each program once. pytest-xdist's workers inherit
# the folder the main process made (its environment), and that process removes it last. A
# test that is about the cache sets its own folder.
_SESSION_CACHE = tempfile.mkdtemp(prefix="jaxflowers-test-xla-")
atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)
os.environ.setdefault("JAXFLOWERS_COMPILE_CACHE", _SESSION_CACHE)

# pytest-xdist's workers ignore SIGINT, and a process started with SIGINT ignored keeps it
# ignored: the tests that press Ctrl-C on a command would see it do nothing.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Where the environment forbids writing bytecode (PYTHONDONTWRITEBYTECODE, as on the CI
# machines), every process the tests start would compile the package from source (about
# 0.1 s each here): compiled once, as an install compiles it.
if sys.dont_write_bytecode:
    import compileall

    compileall.compile_dir(pathlib.Path(__file__).resolve().parents[1] / "jaxflowers", quiet=2)

import jax  # noqa: E402  (must come after the environment above)
import pytest  # noqa: E402

try:  # jax >= 0.4.38 reads this option; older versions only the XLA flag above
    jax.config.update("jax_num_cpu_devices", 4)
except (AttributeError, RuntimeError):
    pass

if os.environ["JAXFLOWERS_COMPILE_CACHE"].lower() != "off":
    from jaxflowers.compilation.cache import enable_compilation_cache  # noqa: E402

    enable_compilation_cache(min_compile_time_s=0.2)

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the default, pyproject.toml): a worker per core, at most four; each worker
    compiles with XLA on its own threads and holds a few GB."""
    return max(1, min(os.cpu_count() or 1, 4))


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """The real photographs beside the checkout; skipped with a reason where absent.

    `.ci/run` sets JAXFLOWERS_REQUIRE_SHARED_DATA=1, which turns that skip into a failure.
    """
    root = SHARED_DATA.resolve()
    if not root.is_dir():
        if os.environ.get("JAXFLOWERS_REQUIRE_SHARED_DATA") == "1":
            pytest.fail(f"{root} is missing but JAXFLOWERS_REQUIRE_SHARED_DATA=1")
        pytest.skip(f"real test images not found at {root} (see shared/data/README.md)")
    return root


@pytest.fixture(scope="session")
def digits():
    import jaxflowers as jf

    return jf.data.digits()


@pytest.fixture
def count_decodes(monkeypatch):
    """Counts calls of the decode function that the resize cache build uses, in this
    process only: a build in decode processes (many local files) counts nothing here."""
    from jaxflowers.data import imread

    calls = []
    real = imread.decode_image

    def counting(data, image_size):
        calls.append(1)
        return real(data, image_size)

    monkeypatch.setattr(imread, "decode_image", counting)
    return calls


@pytest.fixture
def jupyter(monkeypatch):
    """A fake IPython kernel whose display() records what the live plots show:
    a list of (Image, Handle) pairs, one per display(); ``Handle.updates`` holds the
    images that later replaced it in place."""
    shown = []

    class Handle:
        def __init__(self):
            self.updates = []

        def update(self, obj):
            self.updates.append(obj)

    def display(obj, display_id=False):
        assert display_id is True
        shown.append((obj, Handle()))
        return shown[-1][1]

    ipython = types.ModuleType("IPython")
    ipython.version_info = (9, 0)  # read by matplotlib when it makes a canvas
    ipython.get_ipython = lambda: types.SimpleNamespace(kernel=object())
    ipython.display = types.ModuleType("IPython.display")
    ipython.display.display = display
    ipython.display.Image = lambda data, format: types.SimpleNamespace(data=data, format=format)
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", ipython.display)
    return shown
