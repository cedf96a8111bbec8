"""Simulator config: the shipped default, user overrides, located errors, and the CLI."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from specguard import cli
from specguard.errors import ConfigError
from specguard.sim import cluster
from specguard.sim import config as simconfig


def test_shipped_default_documents_three_pools_and_four_tasks():
    cfg = simconfig.load()
    assert [(p.name, p.num_speculative_tokens) for p in cfg.pools] == [
        ("spec-k4", 4),
        ("spec-k2", 2),
        ("nospec", 0),
    ]
    assert set(cfg.tasks) == {"code", "extraction", "chat", "creative"}
    assert cfg.task("unknown").name == cfg.default_task == "chat"
    assert 0.015 <= cfg.cost.step_seconds(1, 0) <= 0.02  # tens of ms at low load: real time works here


def test_user_file_overrides_sections_and_merges_tasks(tmp_path):
    path = tmp_path / "sim.yaml"
    path.write_text(
        "seed: 9\n"
        "pools:\n  - {name: only, num_speculative_tokens: 3, max_num_seqs: 8}\n"
        "tasks:\n  sql:\n    acceptance: [{temperature: 0, conditional: [0.9]}]\n"
        "    output_tokens: {median: 50}\n    prompt_tokens: {median: 20}\n"
    )
    cfg = simconfig.load(path)
    assert cfg.seed == 9 and [p.name for p in cfg.pools] == ["only"]
    assert {"sql", "code", "chat"} <= set(cfg.tasks)
    assert cfg.task("sql").conditional_at(0.0, 3) == (0.9, 0.9, 0.9)


def test_a_partial_cost_section_keeps_the_shipped_values_it_does_not_name(tmp_path):
    """A partial ``cost:`` once fell back to code defaults (knee 128) instead of default.yaml's."""
    shipped = simconfig.load().cost
    path = tmp_path / "sim.yaml"
    path.write_text("cost: {draft_per_position_seconds: 0.004}\ntruth: {concurrency: [1, 2]}\n")
    cfg = simconfig.load(path)
    assert cfg.cost.draft_per_position_seconds == 0.004
    assert cfg.cost == dataclasses.replace(shipped, draft_per_position_seconds=0.004)
    assert cfg.cost.knee_tokens == 192 and cfg.truth_concurrency == (1, 2)


def test_errors_name_file_line_and_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "pools:\n  - {name: a, num_speculative_tokens: -2}\n  - {name: a, colour: red}\n"
        "cost: {knee_tokens: 0}\n"
        "tasks:\n  chat:\n    acceptance: [{temperature: 0, conditional: [1.5]}]\n"
        "    output_tokens: {median: 10, min: 20, max: 5}\n    prompt_tokens: {median: 5}\n"
    )
    with pytest.raises(ConfigError) as info:
        simconfig.load(path)
    text = str(info.value)
    assert f"{path}:2:" in text and "pools[0].num_speculative_tokens: (-2) must be >= 0" in text
    assert "pools[1].colour: unknown key" in text and "pool names must be unique" in text
    assert "cost.knee_tokens: (0) must be >= 1" in text
    assert "tasks.chat.acceptance[0].conditional[0]: (1.5) must be a probability" in text
    assert "tasks.chat.output_tokens.min: (20) must be <= max (5)" in text


def test_fingerprint_mode_is_checked_with_its_place(tmp_path):
    path = tmp_path / "fp.yaml"
    path.write_text("fingerprint_mode: custom\n")
    with pytest.raises(ConfigError) as info:
        simconfig.load(path)
    assert f"{path}:1:" in str(info.value) and "fingerprint_mode" in str(info.value)
    path.write_text("fingerprint_mode: none\n")
    assert simconfig.load(path).fingerprint_mode == "none"
    assert simconfig.load().fingerprint_mode == "full"  # vLLM's default


def test_interpolation_between_temperature_points():
    chat = simconfig.load().task("chat")
    low, mid, high = (chat.conditional_at(t, 4)[0] for t in (0.0, 0.35, 0.7))
    assert low > mid > high and mid == pytest.approx((low + high) / 2)
    assert chat.conditional_at(5.0, 2) == chat.conditional_at(1.0, 2)


def test_cluster_overrides_are_checked():
    with pytest.raises(ConfigError, match="--pools: unknown pool"):
        cluster.SimCluster.from_config(None, pools=["nope"])
    with pytest.raises(ConfigError, match="--dialect"):
        cluster.SimCluster.from_config(None, dialect="tgi")
    sim = cluster.SimCluster.from_config(None, seed=4, port_base=18000, pools=["nospec", "spec-k2"])
    assert [(p.name, p.port) for p in sim.config.pools] == [("nospec", 18000), ("spec-k2", 18001)]
    assert sim.config.seed == 4


def test_cli_prints_config_and_reports_errors(capsys, tmp_path):
    assert cli.main(["simulate", "--pools", "spec-k4", "--time-scale", "0.5", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert '"time_scale": 0.5' in out and '"spec-k4"' in out and "nospec" not in out
    bad = tmp_path / "x.yaml"
    bad.write_text("pools: 3\n")
    assert cli.main(["simulate", "--config", str(bad)]) == 2
    assert "pools: must be a list" in capsys.readouterr().err


def test_simulate_command_serves_until_interrupted():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [sys.executable, "-m", "specguard", "simulate", "--pools", "spec-k2", "--time-scale", "0.1"]
    proc = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        url = lines[1].split()[-1]
        assert "spec-k2" in lines[1] and "K=2" in lines[1] and url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "/health", timeout=10) as response:
            assert response.status == 200
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "simulator stopped" in out and "Traceback" not in err
