"""Read YAML config with every value's position, and collect all errors before reporting.

Each layer parses its own section with a ``Section`` reader; problems are recorded as
``ConfigIssue`` (file:line:column: key.path: message) and raised together as one
``ConfigError``, so ``specguard check-config`` reports every error in one pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from specguard import untrusted, yamlcompose
from specguard.errors import ConfigError, ConfigIssue, InputError
from specguard.yamlcompose import LIMITS, Limits, join_path

__all__ = ["LIMITS", "Document", "Limits", "Section", "load_file", "parse_text", "parse_with"]

T = TypeVar("T")
_MISSING: Any = object()


@dataclass
class Document:
    """A parsed YAML document: plain Python data plus the position of every key path."""

    file: str
    data: Any
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)
    issues: list[ConfigIssue] = field(default_factory=list)

    def where(self, path: str) -> tuple[int | None, int | None]:
        """Line and column (1-based) of ``path``, or of its nearest located parent."""
        probe = path
        while probe:
            if probe in self.positions:
                return self.positions[probe]
            probe = _parent(probe)
        return self.positions.get("", (None, None))

    def error(self, path: str, message: str) -> None:
        line, column = self.where(path)
        self.issues.append(ConfigIssue(self.file, line, column, path, message))

    def raise_if_issues(self) -> None:
        if self.issues:
            raise ConfigError(self.issues)

    def root(self) -> Section:
        return Section(self, "", self.data if self.data is not None else {})


def _parent(path: str) -> str:
    if path.endswith("]"):
        return path[: path.rindex("[")]
    return path.rpartition(".")[0]


def parse_text(text: str, file: str = "<config>", *, limits: Limits = LIMITS) -> Document:
    """Parse YAML text within ``limits``; a syntax error or a limit passed becomes a ConfigError
    naming the line and the column."""
    if len(text) > limits.max_bytes:
        raise ConfigError(ConfigIssue(file, None, None, "", f"larger than {limits.max_bytes} bytes"))
    try:
        data, positions, issues = yamlcompose.compose(text, file, limits)
    except yamlcompose.LimitExceeded as exc:
        line, column = (exc.mark.line + 1, exc.mark.column + 1) if exc.mark else exc.position
        raise ConfigError(ConfigIssue(file, line, column, "", f"refused: {exc.message}")) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark else None
        column = mark.column + 1 if mark else None
        raise ConfigError(ConfigIssue(file, line, column, "", f"invalid YAML: {exc.problem}")) from exc
    except yaml.reader.ReaderError as exc:  # a character YAML refuses: no mark, only a position
        line, column = line_column(text, exc.position)
        problem = f"unacceptable character {_char_text(exc.character, exc.encoding)}: {exc.reason}"
        raise ConfigError(ConfigIssue(file, line, column, "", f"invalid YAML: {problem}")) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(ConfigIssue(file, None, None, "", f"invalid YAML: {exc}")) from exc
    doc = Document(file, data, positions, issues)
    if not isinstance(data, dict):
        doc.error("", f"the top level must be a mapping, got {type(data).__name__}")
    return doc


def line_column(text: str | bytes, position: int) -> tuple[int, int]:
    """1-based line and column of the character (or byte) at ``position`` of ``text``."""
    newline = "\n" if isinstance(text, str) else b"\n"
    before = text[:position]
    line_start = before.rfind(newline) + 1  # type: ignore[arg-type]
    return before.count(newline) + 1, position - line_start + 1  # type: ignore[arg-type]


def _char_text(character: str | bytes | int, encoding: str) -> str:
    """PyYAML's ``ReaderError.character``: a code point (encoding "unicode") or an undecodable byte."""
    if isinstance(character, str | bytes):
        character = ord(character[:1] or "\0")
    return f"#x{character:04x}" if encoding == "unicode" else f"byte #x{character:02x} ({encoding})"


def load_file(path: str | Path, *, limits: Limits = LIMITS) -> Document:
    """Read and parse a config file within ``limits``; an unreadable file (too large, or not in
    UTF-8) is a ConfigError too."""
    raw = read_bytes(path, limits)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = line_column(raw, exc.start)
        message = f"not UTF-8: byte #x{raw[exc.start]:02x} ({exc.reason})"
        raise ConfigError(ConfigIssue(str(path), line, column, "", message)) from exc
    return parse_text(text, str(path), limits=limits)


def read_bytes(path: str | Path, limits: Limits = LIMITS) -> bytes:
    """A file's bytes up to ``limits.max_bytes``; ConfigError when unreadable or larger."""
    try:
        return untrusted.read_bytes(path, limits.max_bytes)
    except OSError as exc:
        raise ConfigError(ConfigIssue(str(path), None, None, "", f"cannot read: {exc.strerror}")) from exc
    except untrusted.NotRegularFile as exc:
        raise ConfigError(
            ConfigIssue(str(path), None, None, "", "refused: " + str(exc).removeprefix(f"{path}: "))
        ) from exc
    except InputError as exc:
        raise ConfigError(
            ConfigIssue(str(path), None, None, "", f"refused: larger than {limits.max_bytes} bytes")
        ) from exc


_TYPE_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}


class Section:
    """Typed access to one mapping of a Document; every problem is recorded, never raised.

    A bad value yields the default, so parsing goes on and reports all errors at once.
    """

    def __init__(self, doc: Document, path: str, data: Any):
        self.doc = doc
        self.path = path
        self.data: dict[str, Any] = data if isinstance(data, dict) else {}
        self._seen: set[str] = set()
        if not isinstance(data, dict):
            doc.error(path, f"must be a mapping, got {_describe(data)}")

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def key_path(self, key: str | int) -> str:
        return join_path(self.path, key)

    def error(self, key: str | None, message: str) -> None:
        self.doc.error(self.key_path(key) if key is not None else self.path, message)

    def get(
        self,
        key: str,
        kind: type[T] | tuple[type, ...],
        default: Any = _MISSING,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        choices: tuple[Any, ...] | None = None,
        nullable: bool = False,
    ) -> Any:
        """Value of ``key`` checked for type, range and choices; the default when absent or bad."""
        self._seen.add(key)
        if key not in self.data:
            if default is _MISSING:
                self.error(key, "is required")
                return None
            return default
        value = self.data[key]
        if value is None and nullable:
            return None
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            wanted = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
            self.error(key, f"must be {wanted}, got {_describe(value)}")
            return None if default is _MISSING else default
        if isinstance(value, float) and not math.isfinite(value):
            self.error(key, f"must be finite, got {value}")
            return None if default is _MISSING else default
        if minimum is not None and isinstance(value, int | float) and value < minimum:
            self.error(key, f"({value}) must be >= {minimum}")
            return None if default is _MISSING else default
        if maximum is not None and isinstance(value, int | float) and value > maximum:
            self.error(key, f"({value}) must be <= {maximum}")
            return None if default is _MISSING else default
        if choices is not None and value not in choices:
            allowed = ", ".join(repr(c) for c in choices)
            self.error(key, f"({value!r}) must be one of {allowed}")
            return None if default is _MISSING else default
        return value

    def section(self, key: str, *, required: bool = False) -> Section:
        """The sub-mapping under ``key`` (an empty one when absent)."""
        self._seen.add(key)
        if key not in self.data or self.data[key] is None:
            if required:
                self.error(key, "is required")
            return Section(self.doc, self.key_path(key), {})
        return Section(self.doc, self.key_path(key), self.data[key])

    def items(self, key: str, *, required: bool = False) -> Iterator[Section]:
        """Each mapping in the list under ``key``."""
        for index, value in self.values(key, required=required):
            yield Section(self.doc, join_path(self.key_path(key), index), value)

    def values(self, key: str, *, required: bool = False) -> Iterator[tuple[int, Any]]:
        """(index, value) for each entry in the list under ``key``."""
        self._seen.add(key)
        value = self.data.get(key)
        if value is None:
            if required:
                self.error(key, "is required")
            return
        if not isinstance(value, list):
            self.error(key, f"must be a list, got {_describe(value)}")
            return
        yield from enumerate(value)

    def check(self, condition: bool, key: str | None, message: str) -> bool:
        """Record ``message`` at ``key`` unless ``condition`` holds; returns the condition."""
        if not condition:
            self.error(key, message)
        return condition

    def reject_unknown(self, also_allowed: tuple[str, ...] = ()) -> None:
        """Unknown keys are errors (a typo must not silently fall back to a default)."""
        for key in self.data:
            if key not in self._seen and key not in also_allowed:
                known = sorted(self._seen | set(also_allowed))
                self.error(key, f"unknown key (known: {', '.join(known)})")


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict | list):
        return _TYPE_NAMES[type(value)]
    return f"{type(value).__name__} {value!r}"


def parse_with(doc: Document, build: Callable[[Section], T]) -> T:
    """Run a section builder over the document root and raise all issues together."""
    result = build(doc.root())
    doc.raise_if_issues()
    return result
