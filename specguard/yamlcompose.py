"""YAML composed within bounds: size, nesting, aliases and the values aliases expand to.

PyYAML's safe loader builds whatever a file describes: a 400-byte "billion laughs" expands to
billions of values, an alias may point at its own ancestor, and deeply nested flow brackets are
scanned in quadratic time. Here the nesting and the aliases are counted while composing, the
expanded size is counted on the node graph before anything is built, and deep flow nesting is
refused before PyYAML scans it. ``configfile`` turns what is refused into a ConfigError with its
line and column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from specguard.errors import ConfigIssue

_MISSING: Any = object()


def join_path(prefix: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    return f"{prefix}.{key}" if prefix else str(key)


@dataclass(frozen=True)
class Limits:
    """Bounds on one YAML or JSON file, so a hostile file costs little to refuse."""

    max_bytes: int = 4 * 1024 * 1024  # file size
    max_depth: int = 64  # nesting of mappings and lists
    max_aliases: int = 100  # ``*alias`` references in the file
    max_nodes: int = 100_000  # values after aliases are expanded (a "billion laughs" stops here)


LIMITS = Limits()


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with a nesting and an alias budget checked while composing."""

    def __init__(self, stream: str, limits: Limits):
        super().__init__(stream)
        self.limits = limits
        self.depth = 0
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > self.limits.max_aliases:
                raise LimitExceeded(event.start_mark, f"more than {self.limits.max_aliases} aliases")
            return super().compose_node(parent, index)
        self.depth += 1
        try:
            if self.depth > self.limits.max_depth:
                raise LimitExceeded(event.start_mark, f"nested deeper than {self.limits.max_depth} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class LimitExceeded(Exception):
    """A limit passed; where: a PyYAML ``mark``, or an ``offset`` into ``text``."""

    def __init__(self, mark: Any, message: str, offset: int = 0, text: str = ""):
        super().__init__(message)
        self.mark = mark
        self.message = message
        line_start = text.rfind("\n", 0, offset) + 1
        self.position = (text.count("\n", 0, offset) + 1, offset - line_start + 1)


class _Builder:
    """Plain Python data from composed nodes, with every key path's position.

    Counts values as aliases expand them (``max_nodes``) and bounds the nesting again (an alias
    may point at its own ancestor); a duplicate key is an issue at the repeated key.
    """

    def __init__(self, file: str, limits: Limits):
        self.file = file
        self.limits = limits
        self.positions: dict[str, tuple[int, int]] = {}
        self.issues: list[ConfigIssue] = []
        self.nodes = 0
        self._scalars: dict[int, Any] = {}  # an aliased scalar is constructed once

    def build(self, node: yaml.Node, path: str = "", depth: int = 1) -> Any:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise LimitExceeded(node.start_mark, f"expands to more than {self.limits.max_nodes} values")
        if depth > self.limits.max_depth:
            raise LimitExceeded(node.start_mark, f"nested deeper than {self.limits.max_depth} levels")
        self.positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise LimitExceeded(
                        key_node.start_mark, "a key must be a plain value, not a list or mapping"
                    )
                key = str(_scalar(key_node))
                key_path = join_path(path, key)
                where = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                if key in out:
                    first = self.positions.get(key_path, (None, None))
                    self.issues.append(
                        ConfigIssue(self.file, *where, key_path, f"duplicate key (first at line {first[0]})")
                    )
                    continue
                out[key] = self.build(value_node, key_path, depth + 1)
                self.positions[key_path] = where
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, join_path(path, i), depth + 1) for i, item in enumerate(node.value)]
        value = self._scalars.get(id(node), _MISSING)
        if value is _MISSING:
            value = self._scalars[id(node)] = _scalar(node)
        return value


FLOW_DEPTH_FACTOR = 4
"""Flow brackets are pre-checked against this multiple of ``max_depth`` (quotes and comments are
only skipped roughly there); the composer checks the exact depth below that."""
_QUOTED_OR_COMMENT = re.compile(r'"(?:[^"\\\n]++|\\.)*+"|\'(?:[^\'\n]++|\'\')*+\'|#[^\n]*+')
_BRACKET = re.compile(r"[\[\]{}]")


def _flow_depth_over(text: str, limit: int) -> int | None:
    """Where ``[``/``{`` brackets first nest deeper than ``limit``, or None (cheap when few)."""
    if text.count("[") + text.count("{") <= limit:
        return None
    cleaned = _QUOTED_OR_COMMENT.sub(lambda m: " " * len(m.group()), text)
    depth = 0
    for match in _BRACKET.finditer(cleaned):
        depth += 1 if match.group() in "[{" else -1
        if depth > limit:
            return match.start()
    return None


def _expanded_size(root: yaml.Node, limits: Limits) -> int:
    """Values ``root`` holds once every alias is expanded, counted once per distinct node (so in
    time proportional to the file); an alias to its own ancestor is refused as too deep."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in visiting:
            raise LimitExceeded(node.start_mark, f"nested deeper than {limits.max_depth} levels")
        total = 1
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            visiting.add(id(node))
            children = (
                (v for pair in node.value for v in pair) if isinstance(node, yaml.MappingNode) else node.value
            )
            for child in children:
                total += size(child)
                if total > limits.max_nodes:
                    raise LimitExceeded(root.start_mark, f"expands to more than {limits.max_nodes} values")
            visiting.discard(id(node))
        sizes[id(node)] = total
        return total

    return size(root)


def _scalar(node: yaml.Node) -> Any:
    constructor = yaml.SafeLoader("")
    try:
        return constructor.construct_object(node, deep=True)
    finally:
        constructor.dispose()


def compose(
    text: str, file: str, limits: Limits
) -> tuple[Any, dict[str, tuple[int, int]], list[ConfigIssue]]:
    """(plain data, position of every key path, issues such as duplicate keys) of one document.

    Raises LimitExceeded, or PyYAML's errors for text that is not YAML.
    """
    deep = _flow_depth_over(text, limits.max_depth * FLOW_DEPTH_FACTOR)
    if deep is not None:
        raise LimitExceeded(
            None, f"nested deeper than {limits.max_depth * FLOW_DEPTH_FACTOR} levels", deep, text
        )
    loader = _BoundedLoader(text, limits)
    try:
        node = loader.get_single_node()
    finally:
        loader.dispose()
    builder = _Builder(file, limits)
    if node is None:
        return {}, builder.positions, builder.issues
    _expanded_size(node, limits)  # before building anything: a bomb costs only its own size
    return builder.build(node), builder.positions, builder.issues
