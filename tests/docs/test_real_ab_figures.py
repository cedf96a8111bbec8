"""docs/real-model.md's A/B tables are the kept runs of the real tier's number test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from test_bench_figures import flat

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import real_ab  # noqa: E402

RESULT = json.loads((ROOT / "bench" / "results" / "real-ab.json").read_text())


def test_the_real_model_page_carries_the_kept_runs():
    fix = "render it again: python3 bench/real_ab.py --render bench/results/real-ab.json"
    assert flat(real_ab.render(RESULT)) in flat((ROOT / "docs" / "real-model.md").read_text()), fix


def test_the_kept_runs_are_this_tests_measurements_of_two_classes():
    assert len({m["run"] for m in RESULT}) >= 3, "three runs by hand"
    for m in RESULT:
        assert set(m["classes"]) == {"extraction/greedy", "creative/high"}
        assert m["gross"] == "met", m  # what every CI run asserts
        for c in m["classes"].values():
            a, lo, hi = c["ab"]
            assert lo <= a <= hi and set(c["scopes"]) >= {"load", m["default_scope"]}
            assert c["scopes"][m["default_scope"]] == c["guard"][0]


def test_the_parser_reads_what_the_test_prints():
    """As ``-s`` prints it: the first line after pytest's progress (the test's file name)."""
    printed = """=== run 1 07:50:00 load 1.20 1.00 0.90 commit abc1234
tests/vllm/test_real_model.py default baseline scope class_then_geometry; 12 prompts per class, seed 400
extraction/greedy: A/B RC 0.711 [0.678, 0.749] (12 pairs) (TPOT 24.1 / 33.9 ms); \
guard RC 0.710 [0.674, 0.748] (TPOT 24.2 / 34.1 ms; live: the class's own level); \
by scope: class_then_geometry 0.710, load 0.696
attempt 1: strict met; gross met"""
    (m,) = real_ab.parse(printed.splitlines())
    assert m["run"] == 1 and m["seed"] == 400 and m["commit"] == "abc1234" and m["strict"] == "met"
    assert m["classes"]["extraction/greedy"]["scopes"] == {"class_then_geometry": 0.710, "load": 0.696}
    assert real_ab.scope_errors([m])["load"] > real_ab.scope_errors([m])["class_then_geometry"]


def test_the_calibration_tells_a_bias_from_noise():
    """The same kept runs with the guard's RC made 15% high: the summary finds the bias."""
    assert real_ab.calibration(RESULT)["bias_lo"] <= 1.0 <= real_ab.calibration(RESULT)["bias_hi"]
    biased = json.loads(json.dumps(RESULT))
    for m in biased:
        for c in m["classes"].values():
            c["guard"] = [round(v * 1.15, 3) for v in c["guard"]]
    cal = real_ab.calibration(biased)
    assert cal["bias_lo"] > 1.05 and cal["covered"] < real_ab.calibration(RESULT)["covered"]
    assert "a bias" in real_ab.render(biased) and "more than two noisy measurements" in real_ab.render(biased)


def test_new_runs_are_added_to_the_kept_ones(tmp_path):
    """``--parse LOG --onto KEPT``: the kept measurements, then the new ones."""
    import subprocess

    log = tmp_path / "run.log"
    log.write_text(
        "=== run 4 09:00:00 load 1.00 1.00 1.00 commit def5678\n"
        "default baseline scope class_then_geometry; 12 prompts per class, seed 400\n"
        "extraction/greedy: A/B RC 0.711 [0.678, 0.749] (12 pairs) (TPOT 24.1 / 33.9 ms); "
        "guard RC 0.710 [0.674, 0.748] (TPOT 24.2 / 34.1 ms; live: the class's own level); "
        "by scope: class_then_geometry 0.710, load 0.696\n"
        "attempt 1: strict met; gross met\n"
    )
    kept = ROOT / "bench" / "results" / "real-ab.json"
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "real_ab.py"), "--parse", str(log), "--onto", str(kept)],
        capture_output=True,
        text=True,
        check=True,
    )
    merged = json.loads(out.stdout)
    assert merged[:-1] == RESULT and merged[-1]["commit"] == "def5678"
    assert "(09:00:00, load 1.0, def5678)" in real_ab.render(merged)
