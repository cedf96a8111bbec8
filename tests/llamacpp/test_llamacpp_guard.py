"""The guard on real llama.cpp servers: its decision per class, made on its own live evidence with
the shipped rule (off when the lower confidence bound of RC is above 1.0), agrees with a ground
truth this test measures itself on the same two servers (interleaved A/B TPOT per class).

The rule is the vLLM tier's: both are intervals, they must overlap (or their points be within 25%);
neither may say "pays" where the other says "loses"; a class whose truth pays must stay on
speculation; pairs are added while no class is decided; a disagreement is measured again once, on
fresh prompts. One greedy copy class and one sampled creative class, short requests: the tier runs
in the default suite.
"""

from __future__ import annotations

import time

import llamacppkit as kit
import pytest

from specguard.lab import loadgen
from specguard.monitor import config
from tests import abcompare, abtiming

pytestmark = pytest.mark.llamacpp

MAX_TOKENS = 16
MIX = [
    loadgen.RequestClass(
        "extraction", temperature=0.0, max_tokens=MAX_TOKENS, prompt_tokens=40, prompts="task"
    ),
    loadgen.RequestClass(
        "creative", temperature=1.0, max_tokens=MAX_TOKENS, prompt_tokens=20, prompts="task"
    ),
]
CLASSES = {("extraction", "greedy"): "copy", ("creative", "high"): "sampled"}
FIRST_PAIRS, MORE_PAIRS, MAX_PAIRS = 6, 4, 14


async def test_guard_decisions_agree_with_interleaved_ab_ground_truth(llamacpp_servers, tmp_path):
    servers = llamacpp_servers
    t0 = time.monotonic()
    report: list[str] = []
    try:
        # a disagreement is measured again on fresh prompts once, as the vLLM tier's A/B is: the two
        # are measured one after the other, and load that moves between them (a CI run: 36% apart,
        # both "loses") goes away with a second measurement; a bias recurs
        for attempt in range(abcompare.ATTEMPTS):
            report.append(f"attempt {attempt + 1}:")
            try:
                await measure_and_judge(servers, tmp_path / f"attempt{attempt}", 10_000 * attempt, report)
                break
            except AssertionError:
                if attempt + 1 == abcompare.ATTEMPTS:
                    raise
    finally:
        report.append(f"wall time {time.monotonic() - t0:.0f} s")
        print("\n".join(report))  # shown with -s; docs/real-model.md quotes a run


async def measure_and_judge(servers, tmp_path, fresh: int, report: list[str]) -> None:
    """1. Ground truth, then 2. the guard on its own live evidence (traffic through the tap, half
    held out on nospec), their prompts' seeds moved by ``fresh``; then the judgement."""
    tmp_path.mkdir()
    truth = await abtiming.ground_truth(
        servers.spec.url, servers.nospec.url, MIX, list(CLASSES), FIRST_PAIRS, MORE_PAIRS, MAX_PAIRS,
        seed=400 + fresh,
    )  # fmt: skip
    text = kit.config_text(servers, holdout=0.5, extra=abtiming.guard_yaml(3, tmp_path))
    cfg = config.parse_text(text, "specguard.yaml")
    ks = {"spec": kit.K, "nospec": 0}
    decisions, measured = await abtiming.guard_on_live_evidence(cfg, MIX, 20, ks, seed=500 + fresh)
    abtiming.judge(CLASSES, truth, measured, decisions, report)
