"""jaxflowers.host.processes: the one way the package starts ``python -m jaxflowers...``
processes."""
import ast
import os
import subprocess
import sys

from jaxflowers.host import processes as launch


def test_a_module_starts_with_this_package_first_and_the_callers_path_kept(tmp_path):
    elsewhere = str(tmp_path / "on-the-path")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": elsewhere}
    site = launch.start_module("site", env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                               text=True)
    lines = site.communicate(timeout=60)[0].splitlines()
    path = ast.literal_eval("[" + "".join(lines[lines.index("sys.path = [") + 1:
                                                lines.index("]")]) + "]")
    assert path.index(launch.PACKAGE_ROOT) < path.index(elsewhere)
    worker = launch.start_module("jaxflowers.sweep.backends.worker", env=env, cwd=tmp_path,
                                 stderr=subprocess.PIPE, text=True)
    assert worker.communicate(timeout=60)[1].startswith("usage: python -m jaxflowers.sweep")
    assert worker.returncode == 2


def test_package_path_puts_the_package_first_once():
    assert launch.package_path(None) == launch.PACKAGE_ROOT
    assert launch.package_path(os.pathsep.join(["/a", launch.PACKAGE_ROOT, "/b"])).split(
        os.pathsep) == [launch.PACKAGE_ROOT, "/a", "/b"]


_EXIT_SCRIPT = """
import atexit, sys, threading, time
from jaxflowers.host.processes import exit_without_teardown

class Noisy:  # the teardown that is skipped would run this
    def __del__(self):
        print("torn down", flush=True)

kept = Noisy()
atexit.register(lambda: open(sys.argv[1], "w").write("atexit ran"))
if sys.argv[2] == "thread":  # a non-daemon thread still working: it must finish
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread done"))).start()
sys.stdout.write("buffered, no newline")
print("to stderr", file=sys.stderr, end="")
exit_without_teardown(3)
print("not reached")
"""


def test_exiting_without_teardown_keeps_the_status_output_and_atexit(tmp_path):
    """The teardown is what it skips (no ``__del__`` at exit); the status, unflushed output
    and atexit functions are kept, and a running non-daemon thread still finishes."""
    env = dict(os.environ, PYTHONPATH=launch.package_path(os.environ.get("PYTHONPATH")))
    for case in ("alone", "thread"):
        marker = tmp_path / f"{case}.txt"
        done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, str(marker), case],
                              capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 3 and done.stderr == "to stderr", done.stderr
        assert marker.read_text() == "atexit ran"
        if case == "alone":
            assert done.stdout == "buffered, no newline"
        else:  # sys.exit joins the thread, then tears down as usual
            assert "thread done" in done.stdout and "not reached" not in done.stdout


def test_a_module_imports_this_package_even_from_a_folder_holding_another(tmp_path):
    """``python -m`` puts the current folder first: a folder holding another ``jaxflowers``
    (a second checkout, an older tree) must not replace the caller's in its workers."""
    other = tmp_path / "jaxflowers"
    other.mkdir()
    (other / "__init__.py").write_text("raise ImportError('the other jaxflowers was imported')")
    worker = launch.start_module("jaxflowers.sweep.backends.worker", cwd=tmp_path,
                                 stderr=subprocess.PIPE, text=True)
    error = worker.communicate(timeout=60)[1]
    assert error.startswith("usage: python -m jaxflowers.sweep"), error[-2000:]
    assert worker.returncode == 2
