"""The layers are a contract: exporters (measure) -> rules (decide) -> monitor (act and run).

A lower layer never imports a higher one; shared value modules import nothing from the project.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specguard"
FORBIDDEN = {
    "exporters": ("specguard.rules", "specguard.monitor"),
    "rules": ("specguard.monitor",),
}
LEAVES = ("errors.py", "exporters/records.py", "exporters/snapshot.py")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_every_module_parses_and_the_layers_exist():
    for layer in ("exporters", "rules", "monitor"):
        assert (PACKAGE / layer / "__init__.py").is_file()


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layer_never_imports_a_higher_one(layer):
    offenders = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for module in imported_modules(path):
            if module.startswith(FORBIDDEN[layer]):
                offenders.append(f"{path.relative_to(PACKAGE.parent)} imports {module}")
    assert offenders == []


@pytest.mark.parametrize("leaf", LEAVES)
def test_shared_value_modules_are_leaves(leaf):
    modules = imported_modules(PACKAGE / leaf)
    assert sorted(m for m in modules if m.startswith("specguard")) == []


def test_no_relative_imports():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.ImportFrom) and n.level > 0 for n in ast.walk(tree)):
            offenders.append(str(path.relative_to(PACKAGE.parent)))
    assert offenders == []
