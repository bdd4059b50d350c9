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
