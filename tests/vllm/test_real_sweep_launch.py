"""``specguard sweep --launch`` on real vLLM with SmolLM2: K 0, 2 and 4 started in turn from command
templates, swept at concurrency 1 and 4 on the real request mix, each engine stopped cleanly."""

from __future__ import annotations

import json
import os
import shlex

import pandas as pd
import pytest
from conftest import SMOL, provision, server_command, server_env

from specguard import cli
from specguard.lab import sweep_launch
from specguard.rules import profile as profile_mod

pytestmark = pytest.mark.vllm


def template(spec: bool) -> str:
    """The conftest command line, with {port} and {k} where the sweep fills them in."""
    venv, model = provision("smollm2")
    cmd = server_command(venv, model, 0, spec, SMOL, k=0)
    cmd[cmd.index("--port") + 1] = "{port}"
    if spec:
        i = cmd.index("--speculative-config") + 1
        cmd[i] = cmd[i].replace('"num_speculative_tokens": 0', '"num_speculative_tokens": {k}')
        assert "{k}" in cmd[i]
    cpu = sorted(os.sched_getaffinity(0))[0]
    env = server_env(cpu)
    pinned = [f"{key}={env[key]}" for key in sorted(env) if key.startswith(("VLLM_", "HF_", "TRANSFORMERS_"))]
    return shlex.join(["env", *pinned, *cmd])


def test_sweep_launch_on_real_vllm_with_smollm2(tmp_path, capsys, monkeypatch):
    groups: list[int] = []
    real_enter = sweep_launch.LaunchedEngine.__enter__

    def enter(self):
        engine = real_enter(self)
        groups.append(engine.proc.pid)
        return engine

    monkeypatch.setattr(sweep_launch.LaunchedEngine, "__enter__", enter)
    args = [
        "sweep", "--launch", template(True), "--launch-nospec", template(False), "--ks", "0,2,4",
        "--levels", "1,4", "--requests", "8", "--max-tokens", "24",
        "--mix", "extraction:0.0,code:0.0,chat:0.7,creative:1.0",
        "--ready-timeout", "300", "-o", str(tmp_path), "--json",
    ]  # fmt: skip
    code = cli.main(args)
    captured = capsys.readouterr()
    assert code == 0, captured.err + "".join(
        (tmp_path / f"engine-k{k}.log").read_text()[-3000:]
        for k in (0, 2, 4)
        if (tmp_path / f"engine-k{k}.log").exists()
    )
    summary = json.loads(captured.out)
    print(captured.err)
    print("\n".join(summary["best_k"] + summary["crossovers"]))
    assert summary["pools"] == ["nospec", "spec-k2", "spec-k4"]
    for pgid in groups:  # every engine's whole process group is gone
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)

    frame = pd.read_csv(tmp_path / "sweep.csv")
    assert set(frame.concurrency) == {1, 4}
    assert set(frame.num_speculative_tokens) == {0, 2, 4}
    spec = frame[(frame.num_speculative_tokens > 0) & (frame.task_type != "all")]
    # n-gram may propose fewer than K drafts: the verify length is measured, at most K + 1
    has_drafts = spec[spec.mean_verify_length.notna()]
    assert not has_drafts.empty
    assert (has_drafts.mean_verify_length > 1).all()
    assert (has_drafts.mean_verify_length <= has_drafts.num_speculative_tokens + 1 + 1e-9).all()
    assert (has_drafts.accept_length <= has_drafts.mean_verify_length + 1e-9).all()
    cols = ["tpot_p50_seconds", "tpot_p99_seconds", "throughput_tokens_per_second", "e2e_p50_seconds"]
    assert frame[frame.task_type == "all"][cols + ["relative_cost"]].notna().all().all()
    # the real ordering: greedy copy tasks accept more than sampled ones, on every K
    for k in (2, 4):
        rate = spec[spec.num_speculative_tokens == k].groupby("temperature_bucket").strict_accept_rate.mean()
        assert rate["greedy"] > max(rate.get("medium", 0.0), rate.get("high", 0.0)), rate
    best = pd.read_csv(tmp_path / "best_k.csv")
    assert set(best.concurrency) == {1, 4} and set(best.best_k) <= {0, 2, 4}
    crossings = pd.read_csv(tmp_path / "rc_crossings.csv")
    assert set(crossings.pool) == {"spec-k2", "spec-k4"}
    profile = profile_mod.load_profile(tmp_path / "profile.yaml")
    assert {p.num_speculative_tokens for p in profile.pools} == {0, 2, 4}
    assert profile.stack["source"] == "specguard sweep --launch"
