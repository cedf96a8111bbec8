"""``specguard status``: from a running instance, or from the persisted plan when it is down."""

from __future__ import annotations

import json

from specguard import cli
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
    assert "creative/high  low   nospec  0  -      -              pinned to nospec" in out
    assert "pin  spec-k4 -> nospec  operator: INC-7" in out


def test_unreachable_without_a_plan_file_is_an_error(capsys):
    assert cli.main(["status", "--url", "http://127.0.0.1:9", "--timeout", "2"]) == 2
    assert "Error: cannot reach http://127.0.0.1:9/status" in capsys.readouterr().err


def test_missing_plan_file_is_an_error(tmp_path, capsys):
    assert cli.main(["status", "--plan-file", str(tmp_path / "none.json")]) == 2
    assert "no plan file" in capsys.readouterr().err
