"""Plain-text tables for the terminal: cells padded to their column's widest, two spaces apart."""

from __future__ import annotations

from collections.abc import Sequence


def aligned(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """One line per row, each column as wide as its widest cell, trailing spaces cut."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
