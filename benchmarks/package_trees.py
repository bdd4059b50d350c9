"""``--tree LABEL=FOLDER`` for the benchmarks that run versions of jaxflowers side by side:
the option parsed and checked once, and the environment under which a child process imports
that folder's package (``python -m`` and ``-c`` put the current folder before ``PYTHONPATH``
unless ``PYTHONSAFEPATH`` is set)."""
import argparse
import os

INSTALLED = ("installed", "")  # the label and folder of the package installed in this Python


def add_argument(parser: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """Add the repeatable ``--tree``; ``optional``: without one, the installed package runs."""
    default = "; default: the installed package" if optional else ""
    parser.add_argument("--tree", action="append", required=not optional,
                        metavar="LABEL=FOLDER",
                        help=f"a folder holding a jaxflowers package (repeatable){default}")


def parse(parser: argparse.ArgumentParser, specs: list[str] | None) -> list[tuple[str, str]]:
    """``(label, absolute folder)`` per ``--tree``, in the order given (``[INSTALLED]`` for
    none). A spec without ``LABEL=``, a label given twice or a folder without the package is
    refused through ``parser.error``, naming the spec."""
    trees = []
    for spec in specs or []:
        label, sep, folder = spec.partition("=")
        if not sep or not label or not folder:
            parser.error(f"--tree {spec}: expected LABEL=FOLDER")
        if label in dict(trees):
            parser.error(f"--tree {spec}: the label {label!r} is given twice")
        if not os.path.isfile(os.path.join(folder, "jaxflowers", "__init__.py")):
            parser.error(f"--tree {spec}: no jaxflowers package in {folder}")
        trees.append((label, os.path.abspath(folder)))
    return trees or [INSTALLED]


def environment(folder: str, base: dict | None = None) -> dict:
    """``base`` (default: this process's environment) with ``folder`` first on ``PYTHONPATH``
    and ``PYTHONSAFEPATH`` set; unchanged for ``""`` (the installed package)."""
    env = dict(os.environ if base is None else base)
    if folder:
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(folder), *rest])
        env["PYTHONSAFEPATH"] = "1"
    return env


def in_round(items: list, round_: int) -> list:
    """``items`` in the order round ``round_`` runs them: odd rounds reversed, so that no tree
    always runs first (on a machine still cold, or with a cache still empty)."""
    return list(items) if round_ % 2 == 0 else list(items)[::-1]
