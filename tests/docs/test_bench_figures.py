"""The controller benchmark's and the robustness matrix's figures in the docs are the kept runs'.

``bench/results/matrix.json`` is the release's ``bench/bench_matrix.py --json`` output and
``bench/results/controller*.json`` its ``bench/bench_controller.py --json`` outputs, and
``bench/results/hostile.json`` its ``bench/bench_hostile.py --json`` output; the matrix's
summary must follow from its rows, and the markdown ``--render`` makes of each must stand in
README.md and docs/benchmarks.md as is.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_controller  # noqa: E402
import bench_hostile  # noqa: E402
import bench_matrix  # noqa: E402

RESULT = json.loads((ROOT / "bench" / "results" / "matrix.json").read_text())
FIX = "render them again: python3 bench/bench_matrix.py --render bench/results/matrix.json"


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_kept_summary_follows_from_its_rows():
    assert bench_matrix.aggregate(RESULT["rows"]) == RESULT["summary"]
    assert (
        len(RESULT["rows"]) == RESULT["summary"]["runs"] >= 8 * 3 * 3
    )  # issue 16: ≥ 8 scenarios, 3 worlds, 3 seeds


@pytest.mark.parametrize(
    ("piece", "doc"),
    [
        ("scenarios", "docs/benchmarks.md"),
        ("goals", "docs/benchmarks.md"),
        ("wall", "docs/benchmarks.md"),
        ("readme", "README.md"),
        ("readme", "docs/index.md"),
    ],
)
def test_the_docs_carry_the_kept_run(piece, doc):
    text = bench_matrix.render(RESULT)[piece]
    assert flat(text) in flat((ROOT / doc).read_text()), f"{doc} does not carry the matrix's {piece}; {FIX}"


@pytest.mark.parametrize("name", ["controller.json", "controller-no-profile.json"])
def test_the_controller_tables_are_the_kept_runs(name):
    result = json.loads((ROOT / "bench" / "results" / name).read_text())
    text = bench_controller.render(result)
    fix = f"render it again: python3 bench/bench_controller.py --render bench/results/{name}"
    assert flat(text) in flat((ROOT / "docs" / "benchmarks.md").read_text()), fix


def test_the_eight_engine_table_is_the_kept_run():
    result = json.loads((ROOT / "bench" / "results" / "matrix-fleet8.json").read_text())
    assert {r["engines"] for r in result["rows"]} == {8}
    text = bench_matrix.render(result)["scenarios"]
    fix = "render it again: python3 bench/bench_matrix.py --render bench/results/matrix-fleet8.json"
    assert flat(text) in flat((ROOT / "docs" / "benchmarks.md").read_text()), fix


@pytest.mark.parametrize(
    ("name", "attacks"), [("hostile.json", {"json", "engine5xx"}), ("hostile-previous.json", {"json"})]
)
def test_the_hostile_input_tables_are_the_kept_runs(name, attacks):
    """docs/reliability.md's data-listener figures are ``bench/bench_hostile.py --json``'s kept runs
    (this release, and the previous one under the same JSON attack)."""
    result = json.loads((ROOT / "bench" / "results" / name).read_text())
    assert attacks <= set(result["attacks"])
    assert result["tracebacks_in_log"] == 0
    text = bench_hostile.render(result)
    fix = f"render it again: python3 bench/bench_hostile.py --render bench/results/{name}"
    assert flat(text) in flat((ROOT / "docs" / "reliability.md").read_text()), fix


def test_the_controller_prose_follows_from_the_kept_runs():
    """The sentences under the two controller tables: which runs miss TPOT p99 or the best single
    pool, the detection delays and the plan changes, as the kept runs give them."""
    text = flat((ROOT / "docs" / "benchmarks.md").read_text())
    rows = json.loads((ROOT / "bench" / "results" / "controller.json").read_text())["rows"]
    misses = [r for r in rows if r["tpot_p99_vs_oracle"] > 1.15]
    said = (
        f"within 1.15× of the oracle's in {len(rows) - len(misses)} of the {len(rows)} runs and misses in "
        + ", ".join(f"`{r['scenario']}` seed {r['seed']} ({r['tpot_p99_vs_oracle']:.2f}×)" for r in misses)
    )
    assert said in text, said
    shift = [r for r in rows if r["scenario"] == "shift"]
    live = sorted(r["detection_delay_live_only_seconds"] for r in shift)
    assert f"{live[0]:.0f}–{live[-1]:.0f} s on live evidence alone" in text
    late = [r for r in shift if r["detection_delay_seconds"] > 0]
    assert all(f"{r['detection_delay_seconds']:.0f} s in seed {r['seed']}" in text for r in late), late
    actions = sorted(r["actions"] for r in rows)
    assert f"most of a run's {actions[0]}–{actions[-1]} plan changes" in text
    bare = json.loads((ROOT / "bench" / "results" / "controller-no-profile.json").read_text())["rows"]
    below = [r for r in bare if r["throughput_vs_best_single_pool"] < 1.0]
    single = sorted(r["throughput_vs_best_single_pool"] for r in bare)
    slow = [r for r in bare if r["tpot_p99_vs_oracle"] > 1.15]
    words = {1: "one", 2: "two", 3: "three", 4: "four"}
    assert (
        f'miss "≥ 1.00× the best single pool" in {words[len(below)]} runs ({single[0]:.3f}–{single[-1]:.3f}) '
        f"and TPOT p99 in {words[len(slow)]} (up to {max(r['tpot_p99_vs_oracle'] for r in bare):.2f}×)"
    ) in text


def test_the_matrix_prose_follows_from_the_kept_runs():
    """The figures typed in the sentences around the matrix tables, from the kept runs."""
    text = flat((ROOT / "docs" / "benchmarks.md").read_text())
    rows = RESULT["rows"]
    eight = json.loads((ROOT / "bench" / "results" / "matrix-fleet8.json").read_text())

    def spread(values) -> str:
        values = list(values)
        return f"{min(values):.2f}–{max(values):.2f}"

    for name in ("tiny-classes", "knee-edge", "flash-crowd", "oscillation"):
        four = spread(r["vs_oracle"] for r in rows if r["scenario"] == name and r["seed"] == 0)
        more = spread(r["vs_oracle"] for r in eight["rows"] if r["scenario"] == name)
        assert (
            f"`{name}` goes from {four} of the oracle to {more}" in text
            or f"`{name}` from {four} to {more}" in text
        )
    mean, worst = eight["summary"]["vs_oracle"]["mean"], eight["summary"]["vs_oracle"]["worst"]
    assert f"the mean ({mean:.3f}) and the worst run ({worst:.3f})" in text
    knee = [r for r in rows if r["scenario"] == "knee-edge"]
    assert (
        f"`knee-edge`: {sum(r['tpot_p99_vs_oracle'] > 1.15 for r in knee)} of {len(knee)} runs above 1.15×"
        in text
    )
    tiny = [r["vs_oracle"] for r in rows if r["scenario"] == "tiny-classes" and r["world"] == "early-knee"]
    assert f"{spread(tiny)} of the oracle in `early-knee`" in text
    slow = sum(r["tpot_p99_vs_oracle"] > 1.15 for r in rows)
    assert f"more TPOT p99 misses ({slow})" in text
