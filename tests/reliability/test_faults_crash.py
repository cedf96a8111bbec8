"""The guard killed with SIGKILL while it writes its plan and audit log, again and again.

A subprocess (``guard_driver``) changes the plan of 60 classes every round, so every round is
one audit batch and one plan write (temp file, fsync, rename). It is killed at random moments.
After each kill: the plan file is whole JSON and loads; the audit log is readable, with at most
one torn line, always at the end of a life; the audit is never behind the plan (it is written
first, so no decision that reached the plan is missing from the audit); a restart picks up the
plan version and appends on a fresh line.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from specguard.monitor import audit as audit_mod
from specguard.monitor import state as state_mod

ROOT = Path(__file__).resolve().parents[2]
KILLS = 6


def start(plan: Path, audit: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.guard_driver", str(plan), str(audit), "60"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_line(proc: subprocess.Popen, prefix: str) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
        if not line and proc.poll() is not None:
            raise AssertionError(f"driver exited {proc.returncode}: {proc.stderr.read()}")
    raise AssertionError(f"driver printed no {prefix!r} line in 30 s")


def last_block(records: list[dict], version: int) -> list[dict]:
    """The last contiguous run of audit records carrying ``version``."""
    block: list[dict] = []
    for record in reversed(records):
        if record["plan_version"] == version:
            block.append(record)
        elif block:
            break
    return block


def test_sigkill_while_writing_plan_and_audit(tmp_path):
    plan, audit = tmp_path / "plan.json", tmp_path / "audit.jsonl"
    rng = random.Random(11)
    readies = []
    known_torn: set[int] = set()
    for _ in range(KILLS):
        proc = start(plan, audit)
        try:
            readies.append(wait_line(proc, "ready"))
            wait_line(proc, "round")
            time.sleep(rng.uniform(0.0, 0.4))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            proc.stdout.close()
            proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL

        # the plan file: whole, never torn (atomic rename)
        doc = state_mod.PlanStore(plan).load_readonly()
        assert doc is not None and len(doc.states) == 60
        json.loads(plan.read_text())
        # the audit log: every line but possibly the last parses
        records, torn = audit_mod.read(audit)
        lines = audit.read_text(errors="replace").splitlines()
        assert set(torn) - known_torn <= {len(lines)}, (torn, len(lines))  # only the very last line
        known_torn |= set(torn)
        # never behind the plan: the decisions of the plan's version are all in the audit
        top = max(r["plan_version"] for r in records)
        assert top in (doc.version, doc.version + 1), (top, doc.version)
        block = last_block(records, doc.version)
        assert {(r["task_type"], r["temperature_bucket"], r["load_bucket"]) for r in block} == set(doc.states)
        for record in block:
            key = (record["task_type"], record["temperature_bucket"], record["load_bucket"])
            assert doc.states[key].pool == record["to"], record

    # every restart resumed from the plan on disk
    versions = [int(line.split()[1]) for line in readies]
    assert versions[0] == 0 and versions == sorted(versions) and versions[-1] > 0
    # a torn line found at a restart is skipped, and nothing after it was swallowed
    records, torn = audit_mod.read(audit)
    lines = audit.read_text(errors="replace").splitlines()
    assert len(records) + len(torn) == len([line for line in lines if line.strip()])
    assert len(torn) <= KILLS
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("plan.json", "audit.jsonl")]
    assert all(name.startswith(".plan.json.") and name.endswith(".tmp") for name in leftovers)
    print(
        f"kills={KILLS} plan_version={versions[-1]} audit_records={len(records)} torn={torn} "
        f"tmp_left={len(leftovers)}"
    )
