"""The demo's narration: the profile's warm starts of one evaluation are one block per pool, every
other plan change one line (with a profile the first evaluation plans every class it knows)."""

from __future__ import annotations

import io

from specguard.cli.commands.demo import Display, Narrator


def decision(t, task, temp, load, to, cause="profile"):
    return {
        "time": t,
        "action": "off" if to == "nospec" else "shorten",
        "task_type": task,
        "temperature_bucket": temp,
        "load_bucket": load,
        "from": "spec-k4",
        "to": to,
        "cause": cause,
        "reason": "spec-k2 0.61 is 16% cheaper per token than spec-k4 0.73; consecutive evaluations",
    }


def test_warm_starts_are_grouped_per_pool_and_live_moves_stand_alone():
    buf = io.StringIO()
    narrator = Narrator(Display(buf, quiet=False), ["low", "medium", "high"])
    for load in ("high", "low", "medium"):
        narrator.decision(decision(10, "creative", "high", load, "nospec"))
    narrator.decision(decision(10, "chat", "medium", "low", "spec-k2"))
    narrator.decision(decision(10, "code", "greedy", "medium", "spec-k2", cause="best_pool"))
    narrator.decision(decision(20, "code", "low", "high", "spec-k2"))  # a new evaluation: a new block
    narrator.flush()
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith(
        ">> t=   10s SHORTEN  code/greedy load=medium: spec-k4 -> spec-k2 (spec-k2 0.61"
    )
    assert lines[1].startswith(">> t=   10s PROFILE  4 (class, load bucket)s with no live evidence yet")
    assert lines[2:4] == [
        "     -> nospec: creative/high (low medium high)",
        "     -> spec-k2: chat/medium (low)",
    ]
    assert lines[4].startswith(">> t=   20s PROFILE  1 (class, load bucket)s") and len(lines) == 6
    narrator.flush()  # nothing held: nothing printed
    assert len(buf.getvalue().splitlines()) == 6
