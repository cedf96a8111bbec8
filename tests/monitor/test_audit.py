"""The audit log: JSON lines, a torn last line skipped and reported, write errors counted."""

from __future__ import annotations

import json
from pathlib import Path

from specguard.monitor import audit


def record(n):
    return {"time": float(n), "class": "chat/low", "load_bucket": "low", "from": "spec-k4", "to": "nospec"}


def test_append_and_read_back(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = audit.AuditLog(path)
    assert log.append([record(1), record(2)])
    assert log.append([record(3)])
    records, skipped = audit.read(path)
    assert [r["time"] for r in records] == [1.0, 2.0, 3.0] and skipped == []


def test_torn_last_line_is_skipped_reported_and_not_glued_to_the_next(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_text(json.dumps(record(1)) + "\n" + json.dumps(record(2))[:25])  # crash mid-write
    log = audit.AuditLog(path)
    assert log.torn_lines == [2]
    assert [r["time"] for r in log.recent] == [1.0]
    log.append([record(3)])
    records, skipped = audit.read(path)
    assert [r["time"] for r in records] == [1.0, 3.0]
    assert skipped == [2]


def test_disk_full_is_counted_and_decisions_stay_in_memory(tmp_path):
    log = audit.AuditLog(tmp_path / "audit.jsonl")
    log.path = Path("/dev/full")  # every write fails with ENOSPC, as on a full disk
    assert log.append([record(1)]) is False
    assert log.append([record(2)]) is False
    assert log.write_errors == 2
    assert [r["time"] for r in log.recent] == [1.0, 2.0]


def test_memory_only_log_keeps_the_last_records():
    log = audit.AuditLog(None, keep=2)
    log.append([record(1), record(2), record(3)])
    assert [r["time"] for r in log.recent] == [2.0, 3.0] and log.write_errors == 0
