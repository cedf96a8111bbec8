"""The persisted plan: atomic writes, reload after a restart, a corrupt file moved aside."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re

import pytest

from specguard.errors import InputError
from specguard.monitor import state as state_mod
from specguard.rules.evidence import AlertRecord
from specguard.rules.guard import ClassState, Pending

POOLS = {"spec-k4": 4, "spec-k2": 2, "nospec": 0}


def doc(version=3):
    states = {
        ("chat", "low", "high"): ClassState(
            key=("chat", "low", "high"),
            pool="spec-k2",
            last_action_at=100.0,
            action_times=(40.0, 100.0),
            pending=Pending("spec-k4", "spec-k2", 0.91, 100.0),
        ),
        ("creative", "high", "low"): ClassState(key=("creative", "high", "low"), pool="nospec", pin="nospec"),
        ("code", "greedy", "low"): ClassState(
            key=("code", "greedy", "low"), pool="spec-k4", paused=True, frozen=True
        ),
    }
    return state_mod.PlanDocument(version, 123.0, states, POOLS)


def test_plan_survives_a_restart(tmp_path):
    path = tmp_path / "state" / "plan.json"
    state_mod.PlanStore(path).save(doc())
    loaded = state_mod.PlanStore(path).load()
    assert loaded.version == 3
    assert loaded.states == doc().states
    assert loaded.routing() == {
        ("chat", "low", "high"): "spec-k2",
        ("creative", "high", "low"): "nospec",
        ("code", "greedy", "low"): "spec-k4",
    }
    stored = json.loads(path.read_text())
    entry = next(e for e in stored["entries"] if e["task_type"] == "chat")
    assert entry["num_speculative_tokens"] == 2
    assert [p.name for p in path.parent.iterdir()] == ["plan.json"]  # no temp file left behind


def test_missing_file_is_no_plan(tmp_path):
    assert state_mod.PlanStore(tmp_path / "absent.json").load() is None


def test_corrupt_file_is_moved_aside_and_reported(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text('{"entries": [{"task_type": "chat"')
    store = state_mod.PlanStore(path)
    assert store.load() is None
    assert "unreadable" in store.recovered and (tmp_path / "plan.json.corrupt").exists()
    assert not path.exists()


ENTRY = {"task_type": "chat", "temperature_bucket": "greedy", "load_bucket": "low", "pool": "spec-k4"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "not a specguard plan"),
        ({"format": 9, "entries": []}, "plan format 9 is not supported"),
        ({"entries": [{"task_type": "chat"}]}, "entries[0].temperature_bucket (None) must be"),
        # every malformed version is an InputError (was ValueError, OverflowError, TypeError)
        ({"version": float("nan"), "entries": []}, "version (nan) must be a whole number"),
        ({"version": float("inf"), "entries": []}, "version (inf) must be a whole number"),
        ({"version": "abc", "entries": []}, "version ('abc') must be a whole number"),
        ({"version": [1], "entries": []}, "version (a list) must be a whole number"),
        ({"version": 13.5, "entries": []}, "version (13.5) must be a whole number"),
        ({"version": True, "entries": []}, "version (True) must be a whole number"),
        ({"version": 2**64, "entries": []}, "must be a whole number from 0 to 2**53"),
        ({"updated_at": "x", "entries": []}, "updated_at ('x') must be a finite number"),
        ({"entries": [7]}, "entries[0]: must be an object"),
        ({"entries": [{**ENTRY, "pool": ["a"]}]}, "entries[0].pool (a list) must be a non-empty string"),
        ({"entries": [{**ENTRY, "paused": "yes"}]}, "entries[0].paused ('yes') must be true or false"),
        ({"entries": [{**ENTRY, "action_times": [1e999]}]}, "action_times[0] (inf) must be a finite"),
        ({"entries": [{**ENTRY, "pending": {"from": "a"}}]}, "entries[0].pending.to (None) must be"),
    ],
)
def test_malformed_plan_names_the_place(data, message):
    with pytest.raises(InputError, match=re.escape(message)):
        state_mod.decode(data, "plan.json")


def test_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "plan.json"
    store = state_mod.PlanStore(path)
    store.save(doc(version=1))

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        store.save(doc(version=2))
    assert state_mod.PlanStore(path).load().version == 1
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_startup_removes_stale_temp_files_of_a_killed_writer(tmp_path, caplog):
    """A SIGKILL between mkstemp and rename leaves ``.plan.json.XXXXXXXX.tmp``: the load at
    startup removes ours once stale (logged) and leaves fresh ones and other files alone."""
    path = tmp_path / "plan.json"
    state_mod.PlanStore(path).save(doc(version=1))
    stale = tmp_path / ".plan.json.k3j_9x0a.tmp"
    fresh = tmp_path / ".plan.json.z8y7x6w5.tmp"  # maybe another writer's write in progress
    others = [tmp_path / ".other.json.k3j_9x0a.tmp", tmp_path / ".plan.json.notours.tmp"]
    for leftover in (stale, fresh, *others):
        leftover.write_text('{"torn')
    old = os.stat(fresh).st_mtime - state_mod.STALE_TEMP_SECONDS - 5
    for leftover in (stale, *others):
        os.utime(leftover, (old, old))
    with caplog.at_level("WARNING", logger="specguard.state"):
        assert state_mod.PlanStore(path).load().version == 1
    assert not stale.exists() and fresh.exists() and all(p.exists() for p in others)
    assert "removed 1 stale temp file" in caplog.text and stale.name in caplog.text
    stale.write_text('{"torn')
    os.utime(stale, (old, old))
    assert state_mod.PlanStore(path).load_readonly().version == 1  # the CLI's read never deletes
    assert stale.exists()


def test_received_alerts_are_kept_with_the_plan(tmp_path):
    alert = AlertRecord(
        "fp-1", "SpecGuardRelativeCostAboveOne", "firing", {"task_type": "code"}, "2026-11-29T10:00:00Z", 90.0
    )
    path = tmp_path / "plan.json"
    state_mod.PlanStore(path).save(dataclasses.replace(doc(), alerts=(alert,)))
    loaded = state_mod.PlanStore(path).load()
    assert loaded.alerts == (alert,) and loaded.states == doc().states
    assert "alerts" not in state_mod.encode(doc())  # no alerts: the plan file looks as before
    with pytest.raises(InputError, match=r"alerts\[0\]\.labels: must be an object of strings"):
        state_mod.decode({"entries": [], "alerts": [{"fingerprint": "x"}]}, "plan.json")


def alert(n: int, status: str = "firing") -> AlertRecord:
    return AlertRecord(
        f"fp-{n}",
        "SpecGuardRelativeCostAboveOne",
        status,
        {"task_type": "code"},
        "2026-11-29T10:00:00Z",
        90.0 + n,
    )


def test_alerts_appended_to_the_journal_are_back_after_a_restart_until_a_whole_write(tmp_path):
    path = tmp_path / "plan.json"
    store = state_mod.PlanStore(path)
    assert not store.can_append(0)  # no plan file to replay onto yet: a whole write first
    store.save(dataclasses.replace(doc(), alerts=(alert(0),)))
    assert store.can_append(0)
    store.append_alerts([alert(1), alert(2)])
    store.append_alerts([alert(1, "resolved")])
    assert store.journal.path == tmp_path / "plan.json.alerts"
    assert json.loads(path.read_text())["alerts"] == [state_mod._alert(alert(0))]  # the file untouched
    loaded = state_mod.PlanStore(path).load()
    assert loaded.alerts == (alert(0), alert(1), alert(2), alert(1, "resolved"))  # oldest first
    assert loaded.states == doc().states
    # a whole write holds them all: the journal starts over
    store.save(dataclasses.replace(doc(), alerts=(alert(0), alert(2), alert(1, "resolved"))))
    assert store.journal.path.read_bytes() == b"" and store.journal.lines == 0
    assert state_mod.PlanStore(path).load().alerts == (alert(0), alert(1, "resolved"), alert(2))


def test_the_journal_is_compacted_at_the_book_size(tmp_path):
    store = state_mod.PlanStore(tmp_path / "plan.json")
    store.save(doc())
    store.append_alerts([alert(n) for n in range(1024)])
    assert not store.can_append(10)  # 1,024 lines: the next batch is a whole write
    assert store.can_append(5000)  # (a book of 5,000: its size is the bound)


def test_a_line_a_crash_cut_short_is_skipped_and_the_rest_kept(tmp_path, caplog):
    path = tmp_path / "plan.json"
    store = state_mod.PlanStore(path)
    store.save(doc())
    store.append_alerts([alert(1), alert(2)])
    with open(store.journal.path, "ab") as handle:
        handle.write(b'{"fingerprint": "fp-3", "alertna')  # killed mid-write: never answered
    restarted = state_mod.PlanStore(path)
    with caplog.at_level(logging.WARNING, logger="specguard.state"):
        assert restarted.load().alerts == (alert(1), alert(2))
    assert "1 line(s) skipped" in caplog.text and "plan.json.alerts:3" in caplog.text
    restarted.append_alerts([alert(4)])  # the torn line was cut off: this one is whole
    assert state_mod.PlanStore(path).load().alerts == (alert(1), alert(2), alert(4))


def test_an_append_the_disk_refused_is_cut_off_so_the_next_one_is_whole(tmp_path, monkeypatch):
    path = tmp_path / "plan.json"
    store = state_mod.PlanStore(path)
    store.save(doc())
    store.append_alerts([alert(1)])
    size = store.journal.path.stat().st_size
    fsync = os.fsync

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        store.append_alerts([alert(2)])
    monkeypatch.setattr(os, "fsync", fsync)
    assert store.journal.path.stat().st_size == size and store.journal.usable
    store.append_alerts([alert(3)])
    assert state_mod.PlanStore(path).load().alerts == (alert(1), alert(3))


def test_without_a_plan_file_an_old_journal_is_dropped(tmp_path):
    path = tmp_path / "plan.json"
    (tmp_path / "plan.json.alerts").write_text(json.dumps(state_mod._alert(alert(1))) + "\n")
    assert state_mod.PlanStore(path).load() is None
    assert not (tmp_path / "plan.json.alerts").exists()
