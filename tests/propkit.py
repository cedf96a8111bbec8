"""Hypothesis profiles of the suite, and each property test's example count under them.

- ``ci`` (``scripts/test``, and any run with ``CI`` set): derandomized (the examples follow from
  each test's source, so every run tries the same ones), no example database (nothing carried from
  an earlier run), at most ``CI_MAX_EXAMPLES`` generated examples per test. A failure there fails
  every run, and is reproduced with the same command.
- ``dev`` (plain ``pytest`` on a workstation): random, with the local database in
  ``.hypothesis/``, each test's own count, so local runs keep exploring and replay what failed.

``SPECGUARD_HYPOTHESIS_PROFILE`` picks one explicitly. Examples found by either are kept as
``@example`` in the test, so they run under both.
"""

from __future__ import annotations

import os

from hypothesis import settings

CI = "ci"
DEV = "dev"
CI_MAX_EXAMPLES = 40

settings.register_profile(CI, derandomize=True, database=None, max_examples=CI_MAX_EXAMPLES, print_blob=True)
settings.register_profile(DEV, print_blob=True)


def profile() -> str:
    """The profile this run uses: the explicit choice, else ``ci`` under CI, else ``dev``."""
    chosen = os.environ.get("SPECGUARD_HYPOTHESIS_PROFILE")
    if chosen:
        return chosen
    return CI if os.environ.get("CI", "").strip().lower() not in ("", "0", "false") else DEV


def examples(n: int) -> int:
    """A property test's example count: ``n`` under ``dev``, at most ``CI_MAX_EXAMPLES`` under ``ci``."""
    return min(n, CI_MAX_EXAMPLES) if profile() == CI else n
