"""The product speaks in its own words: no file a user gets (the package, the docs, the README,
the deploy files, the benchmarks and scripts) names the project's internal notes, the numbered
source articles or tracker issue numbers. A user has none of these; the two source articles are
cited by title in docs/concepts.md ("Sources"), and the rest of the history lives in git.

This test is the one place allowed to spell the words it looks for.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("specguard", "docs", "README.md", "deploy", "bench", "scripts", "mkdocs.yml", "pyproject.toml")
BINARY = {".png", ".pyc", ".svg", ".gz", ".ico"}
GAP = r"[\s#*>/\"'-]+"  # what may stand between two words: spaces, a line break, comment markers
FOREIGN = {
    "a numbered source article": re.compile(rf"\bseeds?{GAP}0\d\d\b", re.I),
    "an internal notes file": re.compile(r"\b(?:CONCEPTS|DESIGN|STYLE)\.md\b"),
    "the internal notes folder": re.compile(r"(?:\.\./|/work/)shared\b|\bresearch/[\w.-]+\.md\b"),
    "a tracker issue number": re.compile(rf"\bissues?{GAP}#?\d+\b", re.I),
}


def shipped_files() -> list[Path]:
    out = []
    for name in SHIPPED:
        path = ROOT / name
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            out += [
                p
                for p in sorted(path.rglob("*"))
                if p.is_file() and p.suffix not in BINARY and "__pycache__" not in p.parts
            ]
    return out


def foreign_words(text: str) -> list[tuple[int, str, str]]:
    """(line, what, the words) of every outside word in ``text``."""
    found = []
    for what, pattern in FOREIGN.items():
        for m in pattern.finditer(text):
            found.append((text.count("\n", 0, m.start()) + 1, what, " ".join(m.group(0).split())))
    return sorted(found)


def test_the_patterns_catch_what_they_must_and_nothing_else():
    caught = {
        "see seed 002's form": "a numbered source article",
        "seeds 000\n# and 002": "a numbered source article",
        "per CONCEPTS.md section 2": "an internal notes file",
        "../shared/research/engines.md": "the internal notes folder",
        "every goal of issue\n16 is met": "a tracker issue number",
        "(Issue 15's default)": "a tracker issue number",
    }
    for text, what in caught.items():
        assert [w for _, w, _ in foreign_words(text)][:1] == [what], text
    for fine in ("seed 0", "seeds 0-2", "seed 7, 8 engines", "docs/concepts.md", "an issue with 3 pools"):
        assert foreign_words(fine) == [], fine


def test_no_shipped_file_speaks_of_the_projects_internals():
    files = shipped_files()
    assert len(files) > 100, "the shipped tree was not found"
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}: {words!r}"
        for path in files
        for line, what, words in foreign_words(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not found, "words from outside the product:\n" + "\n".join(found)
