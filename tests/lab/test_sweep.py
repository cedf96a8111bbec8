"""``specguard sweep``: the CSV and the calibration profile round-trip into the cost model."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from specguard import cli
from specguard.exporters.records import RequestRecord, SpecStats
from specguard.rules import baseline, cost
from specguard.rules import profile as profile_mod
from specguard.rules.cost_config import CostSettings
from specguard.sim import config as sim_config
from specguard.sim import truth


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli.main(
            ["sweep", "--levels", "1,4,16,64", "--requests", "64", "--mix", "code:0.0,creative:1.0",
             "-o", str(out), "--json"]
        )  # fmt: skip
    assert code == 0
    return out, json.loads(buf.getvalue())


def test_outputs_exist(swept):
    out, summary = swept
    assert (out / "sweep.csv").is_file() and (out / "profile.yaml").is_file()
    names = {p.rsplit("/", 1)[-1] for p in summary["plots"]}
    assert names == {"rc_heatmap_spec-k4.png", "rc_heatmap_spec-k2.png", "tpot_vs_concurrency.png"}
    assert (out / "tpot_vs_concurrency.png").read_bytes()[:4] == b"\x89PNG"


def test_csv_matches_the_simulators_truth(swept):
    out, _ = swept
    frame = pd.read_csv(out / "sweep.csv")
    cols = {"pool", "concurrency", "task_type", "temperature_bucket", "tpot_seconds", "relative_cost"}
    cols |= {"throughput_tokens_per_second", "accept_length", "strict_accept_rate", "full_rollback_ratio"}
    assert cols <= set(frame.columns)
    sim = sim_config.load()
    row = frame[(frame.pool == "spec-k4") & (frame.concurrency == 4) & (frame.task_type == "code")].iloc[0]
    assert row.relative_cost == pytest.approx(truth.relative_cost(sim, "code", 0.0, 4, 4), rel=0.15)
    assert row.accept_length == pytest.approx(sim.task("code").expected_accept_length(0.0, 4), rel=0.1)
    assert row.accept_length == pytest.approx(1 + row.strict_accept_rate * 4, rel=1e-6)
    creative = frame[(frame.pool == "spec-k4") & (frame.task_type == "creative")]
    assert (creative.relative_cost > 1.0).all()
    nospec = frame[frame.pool == "nospec"].relative_cost
    assert nospec.notna().all() and ((nospec - 1.0).abs() < 1e-9).all()


def test_profile_is_the_cost_models_baseline(swept):
    out, _ = swept
    frame = pd.read_csv(out / "sweep.csv")
    profile = profile_mod.load_profile(out / "profile.yaml")
    assert {p.name for p in profile.pools} == {"spec-k4", "spec-k2", "nospec"}
    settings = CostSettings().with_traffic([("low", 8), ("high", None)])
    value = baseline.profile_baseline(profile, "low", ["nospec"], settings)
    assert isinstance(value, profile_mod.LevelValue)
    swept_base = frame[(frame.pool == "nospec") & (frame.task_type == "all") & (frame.concurrency == 4)]
    assert value.value == pytest.approx(float(swept_base.tpot_seconds.iloc[0]), rel=0.2)
    # no live no-spec traffic: the cost model falls back on the sweep's profile
    records = [
        RequestRecord(pool="spec-k4", task_type="code", temperature_bucket="greedy", load_bucket="low",
                      route="plan", started_at=100.0 + i, status=200, streamed=True, output_tokens=101,
                      decode_seconds=0.7 + 0.01 * (i % 5),
                      spec=SpecStats(source="vllm", rounds=30, draft_tokens=120, accepted_tokens=70))
        for i in range(40)
    ]  # fmt: skip
    costs = cost.evaluate(records, {"spec-k4": 4, "nospec": 0}, profile, 200.0, settings)
    mine = [c for c in costs if c.pool == "spec-k4"][0]
    assert mine.baseline_source == "profile" and mine.rc is not None
    assert mine.rc == pytest.approx(mine.spec_tpot_seconds / value.value)


def test_bad_grid_is_a_clear_error(capsys):
    assert cli.main(["sweep", "--levels", "1,x"]) == 2
    assert "--levels" in capsys.readouterr().err
    assert cli.main(["sweep", "--pools", "spec-k4"]) == 2
    assert "no-speculation pool" in capsys.readouterr().err


def test_http_sweep_against_the_simulator_over_http(tmp_path):
    import asyncio

    from specguard.sim.cluster import SimCluster

    async def run() -> int:
        async with SimCluster.from_config(None, seed=0, time_scale=0.1) as sim:
            cfg = tmp_path / "config.yaml"
            cfg.write_text(
                "pools:\n"
                + "".join(
                    f'  - {{name: {name}, url: "{sim.urls[name]}", num_speculative_tokens: {k}}}\n'
                    for name, k in (("spec-k4", 4), ("nospec", 0))
                )
            )
            args = ["sweep", "--http", "--config", str(cfg), "--levels", "2", "--requests", "12"]
            args += ["--mix", "code:0.0", "--max-tokens", "48", "-o", str(tmp_path / "out"), "--no-plots"]
            return await asyncio.to_thread(cli.main, args)

    assert asyncio.run(run()) == 0
    frame = pd.read_csv(tmp_path / "out" / "sweep.csv")
    code = frame[(frame.pool == "spec-k4") & (frame.task_type == "code")].iloc[0]
    assert code.relative_cost < 0.8 and code.accept_length > 2.5  # measured over HTTP, engine-reported
    assert profile_mod.load_profile(tmp_path / "out" / "profile.yaml").pool(k=0) is not None
