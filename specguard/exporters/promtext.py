"""Parse a Prometheus text exposition page (0.0.4 and the OpenMetrics subset engines emit).

Hand-written rather than ``prometheus_client.parser``: that parser gives no line numbers on
malformed input and is several times slower on a real 55 KB vLLM page (``bench/bench_parse.py``).
A malformed page raises ``InputError`` naming the line, what was expected and what was found.

Accepted: ``# HELP``/``# TYPE``/``# UNIT`` lines (any order, TYPE may be missing: untyped),
label escapes (``\\\\``, ``\\"``, ``\\n``), labels in any order (stored sorted), NaN/±Inf values,
optional timestamps, OpenMetrics exemplars (ignored) and ``# EOF``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from specguard.errors import InputError

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs: hashable, order-independent

TYPES = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram"}
)
# Sample-name suffixes that belong to a family of each type (besides the bare family name).
SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("_count", "_sum", "_created"),
    "info": ("_info",),
}
_ALL_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info")

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# possessive: a long label value costs no backtracking state (the plain form took ~170x its size)
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]++|\\.)*+)"[ \t]*')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_NUMBER = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[iI]nf(?:inity)?|NaN|nan)")


@dataclass(frozen=True)
class Limits:
    """Bounds on one page; a page past any of them is rejected whole (``PageRejected``)."""

    max_page_bytes: int = 8 * 1024 * 1024
    max_line_bytes: int = 16 * 1024
    max_samples: int = 100_000


LIMITS = Limits()
REJECT_REASONS = ("page_too_large", "line_too_long", "too_many_samples", "not_utf8", "malformed")


class PageRejected(InputError):
    """A page refused before or while parsing; ``reason`` is one of ``REJECT_REASONS``."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple:  # raised in the page worker process, re-raised in the tap
        return (type(self), (str(self), self.reason))


def reject_reason(exc: BaseException) -> str:
    """The ``REJECT_REASONS`` value for an error raised by reading or parsing a page."""
    return exc.reason if isinstance(exc, PageRejected) else "malformed"


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of a page: a sample name, its labels, its value and where it came from."""

    name: str
    labels: Labels
    value: float
    timestamp: float | None = None
    line: int = 0

    def label(self, key: str, default: str | None = None) -> str | None:
        for name, value in self.labels:
            if name == key:
                return value
        return default


@dataclass
class Family:
    """A metric family as declared by ``# TYPE`` (or ``untyped`` when undeclared)."""

    name: str
    type: str = "untyped"
    help: str | None = None
    samples: list[Sample] = field(default_factory=list)

    def owns(self, sample_name: str) -> bool:
        if sample_name == self.name:
            return True
        suffix = sample_name[len(self.name) :] if sample_name.startswith(self.name) else None
        return suffix in SUFFIXES.get(self.type, ())


@dataclass(frozen=True)
class Page:
    """A parsed page: families by declared name and samples by exact sample name."""

    families: dict[str, Family]
    by_name: dict[str, list[Sample]]
    source: str = "<page>"
    duplicates: tuple[Sample, ...] = ()  # samples repeating an earlier series (same name and labels)

    def samples(self, name: str) -> list[Sample]:
        return self.by_name.get(name, [])

    def has(self, name: str) -> bool:
        return name in self.by_name

    def family_names(self) -> list[str]:
        """Families that carry at least one sample, in page order."""
        return [name for name, family in self.families.items() if family.samples]


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)


class _Parser:
    def __init__(self, source: str, limits: Limits = LIMITS):
        self.source = source
        self.limits = limits
        self.count = 0
        self.seen: set[tuple[str, Labels]] = set()
        self.duplicates: list[Sample] = []
        self.families: dict[str, Family] = {}
        self.by_name: dict[str, list[Sample]] = {}
        self.current: Family | None = None
        self.label_cache: dict[str, tuple[Labels, int]] = {}
        self.lineno = 0
        self.line = ""

    def fail(self, expected: str, column: int | None = None) -> InputError:
        where = f"{self.source}:{self.lineno}" + (f":{column + 1}" if column is not None else "")
        shown = self.line if len(self.line) <= 100 else self.line[:97] + "..."
        return InputError(f"{where}: malformed metrics page: expected {expected}; got {shown!r}")

    def family(self, name: str) -> Family:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = Family(name)
        return family

    def comment(self, line: str) -> bool:
        """Handle a ``#`` line; returns True on ``# EOF``."""
        parts = line[1:].split(None, 3)
        if not parts:
            return False
        keyword = parts[0]
        if keyword == "EOF" and len(parts) == 1:
            return True
        if keyword not in ("HELP", "TYPE", "UNIT"):
            return False  # an ordinary comment
        if len(parts) < 2 or not _NAME.fullmatch(parts[1]):
            raise self.fail(f"a metric name after '# {keyword}'")
        family = self.family(parts[1])
        rest = " ".join(parts[2:])
        if keyword == "HELP":
            family.help = _unescape(rest)
        elif keyword == "TYPE":
            kind = rest.strip()
            if kind not in TYPES:
                raise self.fail(f"a metric type ({', '.join(sorted(TYPES))}) after '# TYPE {family.name}'")
            if family.type not in ("untyped", kind) and family.samples:
                raise self.fail(f"one TYPE for {family.name} (already declared {family.type})")
            family.type = kind
        self.current = family
        return False

    def labels(self, line: str, pos: int) -> tuple[Labels, int]:
        """Parse ``{...}`` starting at ``pos`` (the brace); returns labels and the index after '}'."""
        close = line.rfind("}")
        key = line[pos : close + 1] if close > pos else None
        if key is not None:
            cached = self.label_cache.get(key)
            if cached is not None:
                return cached[0], pos + cached[1]
        start, pos = pos, pos + 1
        pairs: list[tuple[str, str]] = []
        while True:
            while pos < len(line) and line[pos] in " \t":
                pos += 1
            if pos < len(line) and line[pos] == "}":
                pos += 1
                break
            match = _LABEL.match(line, pos)
            if match is None:
                raise self.fail('a label name="value" pair or "}"', pos)
            value = match.group(2)
            pairs.append((match.group(1), _unescape(value) if "\\" in value else value))
            pos = match.end()
            if pos < len(line) and line[pos] == ",":
                pos += 1
            elif pos >= len(line) or line[pos] != "}":
                raise self.fail("',' or '}' after a label value", pos)
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            raise self.fail("each label name at most once per sample", start)
        result = tuple(sorted(pairs))
        if key is not None and pos == close + 1:
            self.label_cache[key] = (result, pos - start)
        return result, pos

    def number(self, text: str, what: str, column: int) -> float:
        if not _NUMBER.fullmatch(text):
            raise self.fail(what, column)
        return float(text)

    def sample(self, line: str) -> None:
        match = _NAME.match(line)
        if match is None:
            raise self.fail("a metric name, a '#' comment or an empty line", 0)
        name, pos = match.group(0), match.end()
        labels: Labels = ()
        if pos < len(line) and line[pos] == "{":
            labels, pos = self.labels(line, pos)
        rest = line[pos:]
        if not rest or rest[0] not in " \t":
            raise self.fail("a space and a sample value after the metric name and labels", pos)
        parts = rest.split()
        if "#" in parts:  # OpenMetrics exemplar: ignored
            parts = parts[: parts.index("#")]
        if not parts or len(parts) > 2:
            raise self.fail("a sample value and at most one timestamp", pos)
        value = self.number(parts[0], "a sample value (a number, NaN, +Inf or -Inf)", pos)
        timestamp = None
        if len(parts) == 2:
            timestamp = self.number(parts[1], "a timestamp (a number) after the value", pos)
        family = self.current
        if family is None or not family.owns(name):
            family = self.owner(name)
        self.count += 1
        if self.count > self.limits.max_samples:
            where = f"{self.source}:{self.lineno}"
            raise PageRejected(f"{where}: more than {self.limits.max_samples} samples", "too_many_samples")
        found = Sample(name, labels, value, timestamp, self.lineno)
        series = (name, labels)
        if series in self.seen:
            self.duplicates.append(found)
        else:
            self.seen.add(series)
        family.samples.append(found)
        bucket = self.by_name.get(name)
        if bucket is None:
            self.by_name[name] = [found]
        else:
            bucket.append(found)

    def owner(self, name: str) -> Family:
        family = self.families.get(name)
        if family is not None:
            return family
        for suffix in _ALL_SUFFIXES:
            if name.endswith(suffix):
                family = self.families.get(name[: -len(suffix)])
                if family is not None and family.owns(name):
                    return family
        return self.family(name)

    def run(self, text: str) -> Page:
        done = False
        for self.lineno, line in enumerate(text.split("\n"), start=1):
            if len(line) > self.limits.max_line_bytes:
                raise PageRejected(
                    f"{self.source}:{self.lineno}: line longer than {self.limits.max_line_bytes} bytes "
                    f"({len(line)})",
                    "line_too_long",
                )
            if line.endswith("\r"):
                line = line[:-1]
            self.line = line
            if done:
                if line.strip():
                    raise self.fail("nothing after '# EOF'")
                continue
            if not line or line.isspace():
                continue
            if line[0] in " \t":  # leading blanks are allowed before a sample or a comment
                line = self.line = line.lstrip(" \t")
            if line[0] == "#":
                done = self.comment(line)
            else:
                self.sample(line)
        return Page(self.families, self.by_name, self.source, tuple(self.duplicates))


def parse(text: str | bytes, source: str = "<page>", limits: Limits = LIMITS) -> Page:
    """Parse one exposition page within ``limits``; ``source`` (a file name or URL) prefixes
    every error. Memory stays proportional to the page: lines, samples and the page are bounded."""
    if len(text) > limits.max_page_bytes:
        raise PageRejected(f"{source}: page larger than {limits.max_page_bytes} bytes", "page_too_large")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PageRejected(f"{source}: metrics page is not UTF-8 (byte {exc.start})", "not_utf8") from exc
    # an upper bound of the samples, counted in C: a page of tiny lines is refused before parsing
    lines = text.count("\n") + 1 - text.count("\n#") - text.count("\n\n")
    if lines > limits.max_samples and lines - text.count("\n ") - text.count("\n\t") > limits.max_samples:
        raise PageRejected(f"{source}: more than {limits.max_samples} samples", "too_many_samples")
    return _Parser(source, limits).run(text)


def finite_only(page: Page) -> tuple[Page, int]:
    """``page`` without its NaN and infinite samples, and how many there were.

    An engine's counter at NaN or +Inf once would stay there in every sum built on it (the
    accumulated engine counters, their rates): each such sample is dropped and counted, the
    rest of the page is kept.
    """
    dropped = sum(1 for samples in page.by_name.values() for s in samples if not math.isfinite(s.value))
    if not dropped:
        return page, 0
    for family in page.families.values():
        family.samples = [s for s in family.samples if math.isfinite(s.value)]
    by_name = {}
    for name, samples in page.by_name.items():
        kept = [s for s in samples if math.isfinite(s.value)]
        if kept:
            by_name[name] = kept
    duplicates = tuple(s for s in page.duplicates if math.isfinite(s.value))
    return Page(page.families, by_name, page.source, duplicates), dropped


def carried_line(data: bytes, carried: int, limit: int) -> int | None:
    """Checks a page's lines as it arrives: the length of the unfinished line at the end of
    ``data`` (``carried`` bytes of it came before), or None when a line passes ``limit``.

    Jumps from newline to the last newline within the next ``limit`` bytes, so a chunk costs a
    few ``rfind`` calls however many short lines it holds.
    """
    window = limit - carried
    pos = data.find(b"\n", 0, window + 1)
    if pos < 0:
        return carried + len(data) if len(data) <= window else None
    end = len(data)
    while end - pos - 1 > limit:
        pos = data.rfind(b"\n", pos + 1, pos + limit + 2)
        if pos < 0:
            return None
    return end - data.rfind(b"\n", pos) - 1
