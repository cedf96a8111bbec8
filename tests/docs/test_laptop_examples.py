"""docs/real-model.md's laptop steps fit together: the config its step 3 runs reads the calibration
profile where its step 2's sweep writes it (run from the repository root, as the page says), and
that config is valid."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specguard.monitor import config
from specguard.rules.cost_config import resolve_profile_path

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "real-model.md").read_text(encoding="utf-8")


def blocks() -> list[str]:
    """The page's bash blocks that run a sweep and then the guard, continuation lines joined."""
    found = [b.replace("\\\n", " ") for b in re.findall(r"^```bash\n(.*?)^```", PAGE, re.S | re.M)]
    return [b for b in found if "specguard sweep" in b and "specguard run --config" in b]


def test_the_page_has_both_laptop_paths():
    assert len(blocks()) == 2, "docs/real-model.md: a vLLM and a llama.cpp block, each sweep then run"


@pytest.mark.parametrize("block", blocks(), ids=lambda b: re.search(r"run --config (\S+)", b)[1])
def test_step_3_reads_the_profile_step_2_writes(block):
    written = re.search(r"specguard sweep .*? -o (\S+)", block)
    run = re.search(r"specguard run --config (\S+)", block)
    assert written and run, block
    path = ROOT / run[1]
    cfg = config.load(path)
    profile = resolve_profile_path(cfg.sections["cost"], path)
    assert profile is not None and profile.resolve() == ROOT / written[1] / "profile.yaml", (
        f"{run[1]}: calibration_profile resolves to {profile}; the sweep writes into {ROOT / written[1]}"
    )
