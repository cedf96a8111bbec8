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
    assert lines[0] == ">> t=   10s SHORTEN  code/greedy load=medium: spec-k4 -> spec-k2"
    assert lines[1] == "     spec-k2 0.61 is 16% cheaper per token than spec-k4 0.73; consecutive evaluations"
    assert lines[2].startswith(">> t=   10s PROFILE  4 (class, load bucket)s with no live evidence yet")
    assert lines[3:5] == [
        "     -> nospec: creative/high (low medium high)",
        "     -> spec-k2: chat/medium (low)",
    ]
    assert lines[5].startswith(">> t=   20s PROFILE  1 (class, load bucket)s") and len(lines) == 7
    narrator.flush()  # nothing held: nothing printed
    assert len(buf.getvalue().splitlines()) == 7


def test_a_decision_reason_is_shown_whole_and_wrapped():
    buf = io.StringIO()
    narrator = Narrator(Display(buf, quiet=False), ["low", "medium", "high"])
    reason = "; ".join(
        f"part {i} of a reason that names its numbers and where they come from" for i in range(6)
    )
    narrator.decision(
        {**decision(30, "creative", "high", "low", "nospec", cause="relative-cost"), "reason": reason}
    )
    lines = buf.getvalue().splitlines()
    assert lines[0] == ">> t=   30s OFF      creative/high load=low: spec-k4 -> nospec"
    assert len(lines) > 3 and all(len(line) <= 100 for line in lines)
    assert " ".join(" ".join(lines[1:]).split()) == reason  # nothing cut at the first ";"


def test_live_rows_keep_a_space_before_the_interval_and_say_when_it_is_too_wide():
    from specguard.cli.commands.demo import _rows
    from tests.monitor.test_cost_metrics import cost

    rows = _rows(
        [
            cost("low", 1.37, 1.13, 1.66),
            cost("medium", 0.21, 0.0, 141.14, "model"),
            cost("high", 0.48, 0.40, 0.57, "model"),
        ],
        {},
        {"spec-k4": 4},
        ["low", "medium", "high"],
    )
    assert "1.37 [1.13, 1.66]" in rows[1] and "0.21" not in rows[2]
    assert "not enough evidence [0.00, 141.14]" in rows[2]
    assert "0.48 [0.40, 0.57] !" in rows[3]  # the model says it pays next to a measured loss below it
    assert rows[-1].startswith("! model-baseline RC against a measured loss")
