"""The docs site builds with ``mkdocs build --strict``: a broken link, a missing anchor or a page
left out of the nav fails the suite. The README and the site's front page say the same thing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()


def test_front_page_is_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert index == re.sub(r"\]\(docs/", "](", readme), "docs/index.md: regenerate it from README.md"


def test_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_bytes()) <= 16 * 1024
