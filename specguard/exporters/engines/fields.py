"""Typed reads of per-request JSON fields; a malformed field raises ``InputError`` naming its JSON path."""

from __future__ import annotations

import math
from typing import Any

from specguard.errors import InputError

_MISSING = object()


def at(body: Any, path: str) -> Any:
    """The value at a dotted path (``metrics.speculative_decoding``), or None when absent."""
    node = body
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
        if node is None:
            return None
    return node


def obj(value: Any, path: str) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(value).__name__} {_show(value)}")
    return value


def count(container: dict, key: str, path: str, *names: str) -> int | None:
    """A non-negative integer field (integral floats accepted); the first of ``key, *names`` present."""
    for name in (key, *names):
        value = container.get(name, _MISSING)
        if value is _MISSING or value is None:
            continue
        return as_count(value, f"{path}.{name}")
    return None


def as_count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: expected a non-negative integer, got {_show(value)}")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise InputError(f"{where}: expected a non-negative integer, got {_show(value)}")
    if value < 0:
        raise InputError(f"{where}: expected a non-negative integer, got {_show(value)}")
    return int(value)


def histogram(container: dict, key: str, path: str, *names: str) -> tuple[int, ...] | None:
    """A list of non-negative integer counts (index = drafts accepted in a round)."""
    for name in (key, *names):
        value = container.get(name, _MISSING)
        if value is _MISSING or value is None:
            continue
        where = f"{path}.{name}"
        if not isinstance(value, list):
            raise InputError(f"{where}: expected a list of counts, got {_show(value)}")
        return tuple(as_count(item, f"{where}[{i}]") for i, item in enumerate(value))
    return None


def fraction(container: dict, key: str, path: str) -> float | None:
    value = container.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{path}.{key}: expected a number, got {_show(value)}")
    return float(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
