"""A short soak (~20 s) of the tap, so CI runs ``bench/soak_tap.py``'s code: every response
through the tap equals the direct one, the tap counts every request, its memory stays bounded."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "soak_tap.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("soak_tap", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("soak_tap", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def test_short_soak_loses_and_alters_nothing():
    soak = load_soak()
    result = await soak.soak(20.0, 24, seed=3, sample_every=1.0, warmup=8.0)
    assert result["examples"] == []
    assert result["lost"] == 0 and result["altered"] == 0 and result["direct_failed"] == 0
    assert result["requests"] > 50
    # every request the client sent through the tap was counted once (in its statistics window)
    assert result["tap_counted_requests"] == result["requests"]
    rss = result["rss_mb"]
    assert rss["samples"] >= 10
    assert rss["end"] - rss["after_warmup"] < 40, rss  # bounded, not growing with requests
