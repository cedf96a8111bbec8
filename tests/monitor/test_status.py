"""``specguard status``: from a running instance, or from the persisted plan when it is down."""

from __future__ import annotations

import json
import re
import time

from specguard import cli
from specguard.cli.commands import status as status_cmd
from specguard.monitor import state as state_mod
from specguard.monitor.audit import AuditLog
from specguard.rules.guard import ClassState

KEY = ("creative", "high", "low")


def write_plan(tmp_path):
    doc = state_mod.PlanDocument(
        4, 100.0, {KEY: ClassState(key=KEY, pool="nospec", pin="nospec")}, {"nospec": 0}
    )
    state_mod.PlanStore(tmp_path / "plan.json").save(doc)
    AuditLog(tmp_path / "audit.jsonl").append(
        [
            {
                "time": 99.0,
                "class": "creative/high",
                "load_bucket": "low",
                "action": "pin",
                "from": "spec-k4",
                "to": "nospec",
                "reason": "operator: INC-7",
            }
        ]
    )


def test_falls_back_to_the_plan_file_when_the_instance_is_down(tmp_path, capsys):
    write_plan(tmp_path)
    config = tmp_path / "specguard.yaml"
    config.write_text(
        f"""
pools:
  - {{name: spec-k4, url: "http://127.0.0.1:9", num_speculative_tokens: 4}}
  - {{name: nospec, url: "http://127.0.0.1:9", num_speculative_tokens: 0}}
tap: {{listen: "127.0.0.1:9"}}
actuators: {{plan_file: "{tmp_path / "plan.json"}", audit_log: "{tmp_path / "audit.jsonl"}"}}
"""
    )
    assert cli.main(["status", "--config", str(config), "--json", "--timeout", "2"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert "showing the persisted plan" in status["note"] and status["plan_version"] == 4
    assert status["classes"][0]["pool"] == "nospec" and status["classes"][0]["pin"] == "nospec"
    assert status["decisions"][0]["reason"] == "operator: INC-7"


def test_human_output(tmp_path, capsys):
    write_plan(tmp_path)
    assert (
        cli.main(
            [
                "status",
                "--plan-file",
                str(tmp_path / "plan.json"),
                "--audit-log",
                str(tmp_path / "audit.jsonl"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "plan version 4" in out
    assert "creative/high  low   nospec  0  -      -" in out
    assert "    note: pinned to nospec" in out
    assert "creative/high at load low: pin, spec-k4 -> nospec\n      operator: INC-7" in out


def test_unreachable_without_a_plan_file_is_an_error(capsys):
    assert cli.main(["status", "--url", "http://127.0.0.1:9", "--timeout", "2"]) == 2
    assert "Error: cannot reach http://127.0.0.1:9/status" in capsys.readouterr().err


def test_missing_plan_file_is_an_error(tmp_path, capsys):
    assert cli.main(["status", "--plan-file", str(tmp_path / "none.json")]) == 2
    assert "no plan file" in capsys.readouterr().err


LONG = (
    "relative-cost on spec-k4: rc_lower (1.130) > threshold (1.0) [measured on spec-k4 at load low over "
    "the last 300 s, n=139, baseline live (no-spec requests at this load: 48)]; consecutive_failures (1) <= "
    "consecutive_failure_limit (2) and the rest of a reason long enough to pass every terminal width: END"
)


def live_status(now: float) -> dict:
    def row(load, phase, hold_words, reason, rc, waiting=None, until=None):
        return {
            "task_type": "creative",
            "temperature_bucket": "high",
            "load_bucket": load,
            "pool": "spec-k4",
            "num_speculative_tokens": 4,
            "phase": phase,
            "hold": "x" if hold_words else None,
            "hold_words": hold_words,
            "reason": reason,
            "waiting_for": waiting,
            "until": until,
            "until_what": "earliest move",
            "rc": rc,
        }

    live = {"pool": "spec-k4", "rc": 1.37, "lower": 1.13, "upper": 1.66, "baseline_source": "live"}
    wide = {"pool": "spec-k4", "rc": None, "lower": 0.0, "upper": 141.14, "baseline_source": "model"}
    wide["evidence"] = "not_enough_evidence"
    return {
        "plan_version": 3,
        "policy_version": "abc",
        "last_evaluation": now - 3,
        "interval_seconds": 10,
        "classes": [
            row(
                "low",
                "hold",
                "bad, within limits",
                LONG,
                {**live, "evidence": "enough"},
                "1 more bad evaluation of relative-cost",
                now + 17,
            ),
            row(
                "medium",
                "hold",
                "too little data",
                "samples (23) < min_samples (30)",
                wide,
                "7 more requests of this class on spec-k4",
                now + 7,
            ),
        ],
        "decisions": [],
    }


def test_status_shows_reasons_whole_and_what_a_hold_waits_for():
    now = time.time()
    out = status_cmd.render(live_status(now), columns=80)
    wrapped = [line for line in out.splitlines() if line.startswith("    ")]  # all but the table's rows
    assert len(wrapped) >= 5 and all(len(line) <= 80 for line in wrapped), wrapped
    flat = " ".join(out.split())
    assert " ".join(LONG.split()) in flat  # whole, wrapped: never cut
    assert "hold: bad, within limits" in out and "hold: too little data" in out
    assert "1.37 [1.13, 1.66] (live, spec-k4)" in out
    assert "not enough evidence [0.00, 141.14] (model, spec-k4)" in out
    waiting = r"waiting for: 1 more bad evaluation of relative-cost; earliest move in 1[67] s \("
    assert re.search(waiting, flat)
    assert re.search(r"evaluations every 10 s: last 3 s ago, next in [67] s \(\d\d:\d\d:\d\dZ\)", out)


def test_status_says_why_a_load_bucket_has_no_baseline():
    """A bucket with no baseline says why, every source's reason (here: the model is not read past
    twice the no-spec loads), before how to get one."""
    why = (
        "2 live no-spec requests on nospec in load bucket high (< baseline_min_samples 30); no "
        "calibration profile; model: load 35.0 is more than 2x beyond the loads the no-spec pool ran "
        "at (1.0-1.6): not extrapolated that far"
    )
    report = {
        "load_buckets": [
            {"load_bucket": "low", "source": "live", "available": ["live", "model"], "detail": "x"},
            {"load_bucket": "high", "source": "none", "available": [], "detail": f"{why}; to get one: more"},
        ],
        "missing": [{"pool": "spec-k4", "load_bucket": "high", "how_to_get_one": "more"}],
    }
    out = status_cmd.render({"baselines": report}, columns=80)
    assert "  low      live (also: model)" in out and "  high     none" in out
    flat = " ".join(out.split())
    assert f"why none: {' '.join(why.split())}" in flat
    assert "no baseline for spec-k4/high: to get one: more" in flat
    assert all(len(line) <= 80 for line in out.splitlines() if line.startswith("    "))
