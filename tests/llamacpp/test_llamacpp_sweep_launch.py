"""``specguard sweep --launch`` on real llama.cpp: llama-server with K 0 and 2 (``--spec-draft-n-max``)
started in turn from command templates (scripts/serve-llamacpp, what docs/real-model.md tells users
to run), swept at concurrency 1 and 2 on a greedy copy class and a sampled creative one, each
server stopped cleanly."""

from __future__ import annotations

import json
import os

import llamacppkit as kit
import pandas as pd
import pytest

from specguard import cli
from specguard.lab import sweep_launch
from specguard.rules import profile as profile_mod

pytestmark = pytest.mark.llamacpp


def template(k: str) -> str:
    cpu = sorted(os.sched_getaffinity(0))[0]
    return f"{kit.SERVE} --port {{port}} --cpu {cpu} --k {k}"


def test_sweep_launch_starts_llama_server_per_k(llamacpp_servers, tmp_path, capsys):
    del llamacpp_servers  # provisioned; the servers it started stay idle meanwhile
    args = [
        "sweep", "--launch", template("{k}"), "--launch-nospec", template("0"), "--ks", "0,2",
        "--levels", "1,2", "--requests", "6", "--max-tokens", "10", "--warmup", "1",
        "--seed", "2", "--mix", "extraction:0.0,creative:1.0",
        "--ready-timeout", "120", "-o", str(tmp_path), "--json",
    ]  # fmt: skip
    code = cli.main(args)
    captured = capsys.readouterr()
    assert code == 0, captured.err + "".join(
        (tmp_path / f"engine-k{k}.log").read_text()[-3000:]
        for k in (0, 2)
        if (tmp_path / f"engine-k{k}.log").exists()
    )
    summary = json.loads(captured.out)
    print(captured.err)
    print("\n".join(summary["best_k"] + summary["crossovers"]))
    assert summary["pools"] == ["nospec", "spec-k2"]
    assert [e["k"] for e in summary["engines"]] == [0, 2]
    for engine in summary["engines"]:  # every server's whole process group is gone
        assert engine["leftover_processes"] == 0
        assert sweep_launch.live_members(engine["pid"]) == []

    frame = pd.read_csv(tmp_path / "sweep.csv")
    assert set(frame.concurrency) == {1, 2}
    assert set(frame.num_speculative_tokens) == {0, 2}
    cols = ["tpot_p50_seconds", "throughput_tokens_per_second", "e2e_p50_seconds"]
    assert frame[frame.task_type == "all"][cols + ["relative_cost"]].notna().all().all()
    spec = frame[(frame.num_speculative_tokens == 2) & (frame.task_type != "all")]
    # llama.cpp reports drafts per request (timings.draft_n*), not rounds: acceptance, measured
    rate = spec.groupby("temperature_bucket").strict_accept_rate.mean()
    assert rate.notna().all() and rate["greedy"] > rate["high"], rate
    best = pd.read_csv(tmp_path / "best_k.csv")
    assert set(best.concurrency) == {1, 2} and set(best.best_k) <= {0, 2}
    profile = profile_mod.load_profile(tmp_path / "profile.yaml")
    assert {p.num_speculative_tokens for p in profile.pools} == {0, 2}
    assert profile.stack["source"] == "specguard sweep --launch"
