"""``specguard sweep --launch`` on the simulator: one engine per K started from a template, swept,
stopped; the geometry axis; the best-K and RC-crossing tables."""

from __future__ import annotations

import json
import signal
import sys

import pandas as pd
import pytest

from specguard import cli
from specguard.errors import ConfigError
from specguard.lab import sweep, sweep_launch, sweep_tables

SIM = f"{sys.executable} -m specguard simulate --time-scale 0.2 --port-base {{port}}"  # slow enough to time


def launch_args(out, *extra: str) -> list[str]:
    return [
        "sweep", "--launch", SIM + " --pools spec-k{k}", "--launch-nospec", SIM + " --pools nospec",
        "--ks", "0,2,4", "--levels", "1,4", "--requests", "12", "--mix", "code:0.0,creative:1.0",
        "--max-tokens", "48", "--ready-timeout", "60", "--stop-timeout", "10", "-o", str(out), "--json",
        *extra,
    ]  # fmt: skip


def test_launch_sweeps_each_k_in_turn_and_stops_every_engine(tmp_path, capsys):
    assert cli.main(launch_args(tmp_path, "--no-plots")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pools"] == ["nospec", "spec-k2", "spec-k4"]
    # every engine was started in its own process group, stopped by SIGTERM, and its group is gone
    engines = summary["engines"]
    assert [e["k"] for e in engines] == [0, 2, 4]
    for engine in engines:
        assert engine["exit_status"] in (0, -signal.SIGTERM) and engine["ready_seconds"] > 0
        assert engine["leftover_processes"] == 0
        assert sweep_launch.live_members(engine["pid"]) == []
    frame = pd.read_csv(tmp_path / "sweep.csv")
    assert set(frame.num_speculative_tokens) == {0, 2, 4} and set(frame.concurrency) == {1, 4}
    code = frame[(frame.pool == "spec-k4") & (frame.task_type == "code")]
    # what the source article asks for, per cell
    cols = ["mean_verify_length", "accept_length", "strict_accept_rate", "tpot_p50_seconds"]
    cols += ["tpot_p99_seconds", "throughput_tokens_per_second", "e2e_p50_seconds", "e2e_p99_seconds"]
    assert code[cols].notna().all().all()
    assert (code.mean_verify_length == 5.0).all()  # the simulator always drafts K
    assert (code.relative_cost < 1.0).all()
    nospec = frame[frame.pool == "nospec"]
    assert (nospec.mean_verify_length == 1.0).all() and (nospec.relative_cost.sub(1).abs() < 1e-9).all()
    best = pd.read_csv(tmp_path / "best_k.csv")
    assert set(best.concurrency) == {1, 4}
    code_best = best[best.task_type == "code"]
    assert (code_best.best_k > 0).all()
    crossings = pd.read_csv(tmp_path / "rc_crossings.csv")
    assert set(crossings.pool) == {"spec-k2", "spec-k4"}
    assert summary["best_k"] and summary["crossovers"]
    for k in (0, 2, 4):
        assert (tmp_path / f"engine-k{k}.log").is_file()


def test_an_engine_that_dies_stops_the_sweep_with_its_log(tmp_path, capsys):
    args = launch_args(tmp_path)
    args[args.index("--launch") + 1] = (
        f"{sys.executable} -c \"import sys; print('boom {{k}} {{port}}'); sys.exit(3)\""
    )
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "exited with code 3" in err and "boom" in err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--ks", "2,4", "needs K = 0"),
        ("--ks", "0,x", "--ks"),
        ("--launch", "serve --port 1", "must contain {k}"),
        ("--launch-nospec", "serve", "must contain {port}"),
        ("--launch", "serve {k} {port} 'unclosed", "cannot split"),
        ("--http", None, "either --launch"),
        ("--pools", "nospec", "not with --launch"),
        ("--geometry", "huge", "PROMPTxDECODE"),
    ],
)
def test_bad_launch_flags_are_clear_errors(tmp_path, capsys, flag, value, message):
    args = launch_args(tmp_path)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag] if value is None else [flag, value]
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err


def test_geometry_is_a_sweep_axis_in_the_simulator(tmp_path, capsys):
    args = ["sweep", "--levels", "1,8", "--requests", "32", "--mix", "code:0.0,creative:1.0",
            "--pools", "spec-k4,nospec", "--geometry", "short-prompt-long-decode,long-prompt-short-decode",
            "-o", str(tmp_path), "--json"]  # fmt: skip
    assert cli.main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["geometries"] == ["short-prompt-long-decode", "long-prompt-short-decode"]
    assert summary["profile_geometry"] == "short-prompt-long-decode"
    frame = pd.read_csv(tmp_path / "sweep.csv")
    assert set(frame.geometry) == {"short-prompt-long-decode", "long-prompt-short-decode"}
    whole = frame[frame.task_type == "all"].set_index(["pool", "geometry", "concurrency"])
    # the decode length is the geometry's (the simulator ignores EOS under a geometry)
    short = whole.loc[("nospec", "long-prompt-short-decode", 1)]
    assert short.output_tokens == 32 * short.requests
    # a long prompt's prefill stalls the batch's decode steps: TPOT rises with the prompt at c=8
    assert whole.loc[("nospec", "long-prompt-short-decode", 8)].tpot_seconds > (
        whole.loc[("nospec", "short-prompt-long-decode", 8)].tpot_seconds
    )
    # RC is against the no-spec pool of the same geometry
    rc = frame.set_index(["pool", "geometry", "concurrency", "task_type"])
    for geometry in ("short-prompt-long-decode", "long-prompt-short-decode"):
        mine = rc.loc[("spec-k4", geometry, 8, "code")]
        base = rc.loc[("nospec", geometry, 8, "code")]
        assert mine.relative_cost == pytest.approx(mine.tpot_seconds / base.tpot_seconds)
    for geometry in summary["geometries"]:
        assert (tmp_path / geometry / "tpot_vs_concurrency.png").is_file()


def test_geometry_parsing():
    got = sweep.parse_geometries("long-prompt-short-decode, 512x64")
    assert got == (sweep.GEOMETRIES["long-prompt-short-decode"], sweep.Geometry("512x64", 512, 64))
    for bad in ("0x5", "512x", "x", "long", "512x64,512x64", ""):
        with pytest.raises(ConfigError):
            sweep.parse_geometries(bad)


def frame_of(rcs: dict[int, float], k: int = 4) -> pd.DataFrame:
    rows = []
    for c, rc in rcs.items():
        for pool, kk, value in (("spec", k, rc), ("nospec", 0, 1.0)):
            rows.append({"pool": pool, "num_speculative_tokens": kk, "geometry": "mix", "concurrency": c,
                         "task_type": "code", "temperature_bucket": "greedy", "relative_cost": value,
                         "tpot_seconds": 0.01 * value})  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("rcs", "status", "where"),
    [
        pytest.param({1: 0.5, 2: 0.8, 4: 1.2, 8: 1.5}, "crosses", 2 ** (1 + 0.2 / 0.4), id="up"),
        pytest.param({1: 1.5, 4: 0.5}, "crosses-down", 2 ** (0 + 0.5 / 1.0 * 2), id="down"),
        pytest.param({1: 0.5, 4: 0.9}, "pays-everywhere", None, id="pays"),
        pytest.param({1: 1.0, 4: 1.3}, "never-pays", None, id="never"),
    ],
)
def test_rc_crossing_is_interpolated_in_log_concurrency(rcs, status, where):
    row = sweep_tables.rc_crossings(frame_of(rcs)).iloc[0]
    assert row.status == status
    if where is None:
        assert pd.isna(row.crossing_concurrency)
    else:
        assert row.crossing_concurrency == pytest.approx(where, abs=0.01)


def test_best_k_picks_the_lowest_tpot_and_zero_when_speculation_loses():
    table = sweep_tables.best_k(frame_of({1: 0.5, 8: 1.4}))
    assert list(table.best_k) == [4, 0]
    assert list(table.best_rc) == [0.5, 1.0]
