"""The layers are a contract, checked on the source:

    exporters (measure) -> rules (decide) -> monitor (the running service that acts)
    sim (the engine simulator) beside them, on the shared value types only
    lab (demo, replay, sweep, report) on top of all four
    cli (the ``specguard`` command) a thin shell over everything

A package never imports one above it; shared value modules import nothing from the project;
no two modules import each other, directly or through others.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specguard"
LAYERS = ("exporters", "rules", "monitor", "sim", "lab", "cli")
FORBIDDEN = {
    "exporters": ("rules", "monitor", "sim", "lab", "cli"),
    "rules": ("monitor", "sim", "lab", "cli"),
    "monitor": ("sim", "lab", "cli"),
    "sim": ("rules", "monitor", "lab", "cli"),
    "lab": ("cli",),
}
LEAVES = ("columns.py", "errors.py", "schedules.py", "exporters/records.py", "exporters/snapshot.py")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path) -> set[str]:
    """Every module named by an import anywhere in ``path`` (function-level and TYPE_CHECKING too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_every_layer_is_a_package():
    for layer in LAYERS:
        assert (PACKAGE / layer / "__init__.py").is_file()


def test_monitor_holds_only_the_service():
    service_only = {p.name for p in (PACKAGE / "monitor").iterdir() if p.suffix == ".py" or p.is_dir()}
    for moved in ("sim", "commands", "cli.py", "demo.py", "replay.py", "sweep.py", "report.py", "loadgen.py"):
        assert moved not in service_only


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layer_never_imports_a_higher_one(layer):
    offenders = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "specguard" and len(parts) > 1 and parts[1] in FORBIDDEN[layer]:
                offenders.append(f"{path.relative_to(PACKAGE.parent)} imports {module}")
    assert offenders == []


@pytest.mark.parametrize("leaf", LEAVES)
def test_shared_value_modules_are_leaves(leaf):
    modules = imported_modules(PACKAGE / leaf)
    assert sorted(m for m in modules if m.startswith("specguard")) == []


def module_edges(path: Path) -> set[str]:
    """The project modules ``path`` depends on: ``from pkg import sub`` names ``pkg.sub``, not ``pkg``."""
    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                edges.add(sub if sub in MODULES else node.module)
    return edges


def import_graph() -> dict[str, set[str]]:
    return {
        name: {m for m in module_edges(path) if m in MODULES and m != name} for name, path in MODULES.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_relative_imports():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.ImportFrom) and n.level > 0 for n in ast.walk(tree)):
            offenders.append(str(path.relative_to(PACKAGE.parent)))
    assert offenders == []
