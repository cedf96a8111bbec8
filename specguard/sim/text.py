"""Deterministic pseudo-words for generated text: one word per output token.

Token counts are what matter; the text only has to look like text and be reproducible.
"""

from __future__ import annotations

import random

_SYLLABLES = ("ka", "lo", "mi", "ren", "to", "sa", "vel", "na", "qui", "dor", "an", "es", "por", "li", "mu")


class WordStream:
    """An endless reproducible stream of pseudo-words (each a leading space + 1-3 syllables)."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def take(self, count: int) -> str:
        rng = self._rng
        return "".join(
            " " + "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(count)
        )


def count_tokens(text: str) -> int:
    """Prompt tokens for a text: about four characters per token, at least one."""
    return max(1, (len(text) + 3) // 4)
