"""The import graph: no cycles, and data/ knows nothing of devices or training."""
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _imports(path: pathlib.Path, package: str) -> set[str]:
    """The jaxflowers modules ``path`` imports (at module level or inside functions)."""
    import ast

    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative: resolve against the importing module's package
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + [node.module])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {name for name in found if name.startswith("jaxflowers")}


def _graph() -> dict[str, set[str]]:
    modules = {}
    for path in (ROOT / "jaxflowers").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return {name: {m for m in _imports(path, name) if m in modules and m != name}
            for name, path in modules.items()}


def test_the_import_graph_has_no_cycles():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + "."):
                continue  # a package importing its own submodules (lazy names) is no cycle
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_data_knows_nothing_of_devices_or_training():
    """Feeds supply host arrays; placing and compiling is the training program's job."""
    graph = _graph()
    banned = ("jaxflowers.parallel.data_parallel", "jaxflowers.training.step",
              "jaxflowers.training.run",
              "jaxflowers.training.program", "jaxflowers.training.loop")
    for name, targets in graph.items():
        if name.startswith("jaxflowers.data"):
            assert not [t for t in targets if t.startswith(banned)], (name, targets)


def _layers() -> dict[str, int]:
    """Package -> rank (0 lowest) from ARCHITECTURE.md's table of layers, highest first."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    table = text[text.index("| layer | packages |"):].split("\n\n")[0].splitlines()[2:]
    rows = [[name.strip().replace("\\_", "_") for name in row.split("|")[2].split(",")]
            for row in table]
    return {name: len(rows) - 1 - i for i, names in enumerate(rows) for name in names}


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_imports_go_down_the_layers_architecture_md_names():
    """Every import (inside functions too) goes to the importer's own layer or a lower
    one, as ARCHITECTURE.md's table says; and the table names every package."""
    layers = _layers()
    graph = _graph()
    packages = {_top(name) for name in graph} - {"__init__"}
    assert packages <= set(layers), f"ARCHITECTURE.md does not place {packages - set(layers)}"
    # The package root only names its public attributes (lazily): it belongs to no layer.
    upward = sorted((name, target) for name, targets in graph.items() for target in targets
                    if "__init__" not in (_top(name), _top(target))
                    and _top(target) != _top(name) and layers[_top(target)] > layers[_top(name)])
    assert not upward, "imports up the layers: " + ", ".join(f"{a} -> {b}" for a, b in upward)
