"""The packages' import graph has no cycle: every import statement, at module level or inside a function, read from the
source (a function-level import hides a cycle from Python, not from a reader)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("xpress_core", "xpress_app")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (``from package import module`` names the module, not the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imported(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path that ends where it starts, or None (depth-first search, colouring nodes)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_module_imports_itself_back():
    graph = import_graph()
    assert graph["xpress_core.bench.cli"] >= {"xpress_core.data", "xpress_core.bench.measure"}  # the walk sees imports
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


@pytest.mark.parametrize(
    "module,forbidden",
    [
        ("xpress_core.models", "xpress_core.engine"),  # loading does not depend on the decoding loop
        ("xpress_core.drafters.dflash_format", "xpress_core.presets"),  # a format reader does not know the menu
        ("xpress_core.bench.measure", "xpress_core.train.cli"),
    ],
)
def test_layers_stay_apart(module, forbidden):
    graph = import_graph()
    inside = [name for name in graph if name == module or name.startswith(module + ".")]  # a package: every module
    assert inside and all(forbidden not in graph[name] for name in inside)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
