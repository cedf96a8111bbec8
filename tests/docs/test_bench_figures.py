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
