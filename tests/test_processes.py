"""jaxflowers.host.processes: the one way the package starts ``python -m jaxflowers...``
processes."""
import ast
import os
import subprocess

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
