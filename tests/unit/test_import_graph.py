"""The package's modules import one another without a circle, and only downward through the
layers declared once below: every ``import`` inside denseccl, at module level or inside a
function, read from the source (a circle held together by a function-level import still ties
two modules into one, and a climb inside a function is a climb all the same)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[2] / "denseccl"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: Set[str]) -> Set[str]:
    """The package modules ``path`` imports (``from . import x`` counts x when it is a module)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target in modules:
                found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules}
    found.discard(name)
    return found


def _graph() -> Dict[str, Set[str]]:
    """Module -> the package modules it imports. A package's ``__init__`` is no target: importing
    any submodule runs it anyway, and ``from . import x`` names x, not it."""
    paths = [path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts]
    modules = {_module_name(path) for path in paths}
    packages = {_module_name(path) for path in paths if path.name == "__init__.py"}
    return {_module_name(path): _imports(path, modules) - packages for path in paths}


#: the layers, lowest first: a module may import its own layer and those below, never above.
#: Each entry names modules, or packages (every module under them); a module placed nowhere fails.
LAYERS = [
    ("the pure core", ["errors", "config", "log", "layout", "dtypes", "ops", "arrays", "streams", "wait"]),
    ("the agreement and its channel", ["channel", "transport", "agreement"]),
    ("the flow", ["flow", "recorder", "trace_files"]),
    ("the communicator", ["communicator"]),
    ("the engines", ["backends"]),
    # the one place that knows every backend: it chooses one and builds the Communicator on its parts
    ("the bootstrap", ["bootstrap"]),
    ("the adapters", ["torch"]),
    ("the tools and the public names", ["bench", "envreport", "trace_summary", "__main__", ""]),
]


def _layer(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (the longest entry that holds it)."""
    name = module[len("denseccl."):] if module.startswith("denseccl.") else ""
    best = (-1, -1)
    for index, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if name == entry or (entry and name.startswith(entry + ".")):
                best = max(best, (len(entry), index))
    return best[1]


def _climbs(graph: Dict[str, Set[str]]) -> List[str]:
    """Every import that climbs a layer, as "importer (its layer) imports target (its layer)"."""
    found = []
    for module in sorted(graph):
        for target in sorted(graph[module]):
            if _layer(target) > _layer(module):
                found.append(
                    f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
                )
    return found


def _circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Every circle through a module, as the path from it and back to it."""
    circles = []
    for start in sorted(graph):
        seen, stack = {start}, [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    circles.append(path + [start])
                elif nxt not in seen and nxt in graph:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return circles


def test_the_nccl_backend_has_no_import_circle():
    graph = _graph()
    nccl = "denseccl.backends.nccl"
    assert f"{nccl}.transport" in graph[f"{nccl}.init"]  # init builds the transport
    assert f"{nccl}.init" not in graph[f"{nccl}.transport"]
    assert {f"{nccl}.tables", f"{nccl}.library"} <= graph[f"{nccl}.transport"]
    assert _circles(graph) == []  # nor has any other part of the package


def test_the_graph_reader_finds_a_circle():
    """The reader itself: a circle through a function-level import is found."""
    assert _circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b", "a"], ["b", "a", "b"]]


def test_every_module_has_a_layer():
    assert [module for module in sorted(_graph()) if _layer(module) < 0] == []


def test_imports_only_go_down_the_layers():
    assert _climbs(_graph()) == []


def test_the_layer_reader_names_a_climb():
    """The reader itself: the core importing a backend is named, importer first."""
    graph = {"denseccl.flow": {"denseccl.backends.mpi.transport", "denseccl.errors"}, "denseccl": {"denseccl.flow"}}
    assert _climbs(graph) == [
        "denseccl.flow (the flow) imports denseccl.backends.mpi.transport (the engines)"
    ]
    assert _layer("denseccl") == len(LAYERS) - 1 and _layer("denseccl.channel.board") == 1
