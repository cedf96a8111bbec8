"""The comparison's checks (``lab.summary``): the bound, and plan changes per class per hour."""

from __future__ import annotations

from specguard.lab import summary


def row(tput: float) -> dict:
    return {"throughput_tokens_per_second": tput, "phases": []}


def test_the_bound_fails_when_a_row_beats_the_oracle_by_more_than_the_noise():
    policies = {"oracle": row(1000.0), "best_single_pool": row(990.0), "specguard": row(1004.0)}
    assert summary.bound(policies, 0.005)["holds"]  # 0.4% over: inside 0.5% of noise
    check = summary.bound(policies, 0.003)
    assert not check["holds"] and check["max_ratio_row"] == "specguard"
    assert abs(check["max_ratio_to_oracle"] - 1.004) < 1e-9


def test_changes_per_class_are_counted_in_any_hour():
    def d(t, load="low", task="chat"):
        return {"time": t, "task_type": task, "temperature_bucket": "medium", "load_bucket": load}

    decisions = [d(0), d(100), d(3599), d(3600), d(3700), d(50, "high"), d(60, task="code")]
    # any span shorter than an hour holds at most 3 of chat/medium/low's (0, 100, 3599 or 3599, 3600, 3700)
    assert summary.max_changes_per_class_hour(decisions) == 3
    assert summary.max_changes_per_class_hour(decisions + [d(3650)]) == 4
    assert summary.max_changes_per_class_hour([]) == 0
