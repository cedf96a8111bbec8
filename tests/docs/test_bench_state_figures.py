"""The state-and-limits attacks' figures in docs/reliability.md are the kept run's.

``bench/results/hostile-state.json`` is ``bench/bench_hostile.py --suite state --json`` output; the
table ``--render`` makes of it must stand in docs/reliability.md as is, and the kept run must have
lost nothing (every webhook answered 200, every scrape served, no traceback in the tap's log).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from test_bench_figures import flat

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_hostile  # noqa: E402

RESULT = json.loads((ROOT / "bench" / "results" / "hostile-state.json").read_text())


def test_the_reliability_doc_carries_the_kept_state_run():
    text = bench_hostile.render_state(RESULT)
    fix = "render it again: python3 bench/bench_hostile.py --render bench/results/hostile-state.json"
    assert flat(text) in flat((ROOT / "docs" / "reliability.md").read_text()), fix


def test_the_kept_state_run_lost_nothing():
    """Every webhook answered 200, every scrape served, no traceback (the docs say whether the
    p99 target was met: the render states it from the figures)."""
    for name in ("alert_book", "many_classes"):
        assert RESULT[name]["tracebacks_in_log"] == 0
    assert RESULT["alert_book"]["webhooks"]["ok"] == RESULT["alert_book"]["webhooks"]["sent"] > 0
    assert RESULT["many_classes"]["metrics"]["status"] == [200]
