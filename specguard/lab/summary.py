"""What the comparison reports of one replay, and the checks across rows.

Throughput and TPOT overall and per phase, the engines the fleet used (``lab.fleet``: the same N
for every row), and plan changes per class per hour; then the ratios of specguard to each row and
the bound check: no row may beat the oracle by more than the measured run-to-run noise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from specguard.lab import replay
from specguard.lab import scenario as scenario_mod

HOUR = 3600.0


def tpot_stats(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, p99) in milliseconds; (None, None) without values."""
    if not values:
        return None, None
    arr = np.asarray(values)
    return float(arr.mean() * 1000), float(np.percentile(arr, 99) * 1000)


def summarize(result: replay.ReplayResult, label: str, **extra) -> dict:
    """Throughput and TPOT of one replay, overall and per phase, and the engines it used."""
    scen = result.scenario
    tokens = sum(result.tokens.values())
    mean, p99 = tpot_stats([f.tpot for f in result.finished if f.tpot is not None])
    phases = []
    for index, (start, end, phase) in enumerate(scen.boundaries()):
        phase_tokens = sum(v for (i, _), v in result.tokens.items() if i == index)
        in_phase = [f.tpot for f in result.finished if f.tpot is not None and start <= f.ended < end]
        pm, pp = tpot_stats(in_phase)
        phases.append(
            {
                "name": phase.name,
                "throughput_tokens_per_second": phase_tokens / phase.duration_s,
                "tpot_mean_ms": pm,
                "tpot_p99_ms": pp,
                "requests": len(in_phase),
            }
        )
    return {
        "label": label,
        "throughput_tokens_per_second": tokens / scen.duration_s,
        "tpot_mean_ms": mean,
        "tpot_p99_ms": p99,
        "requests": len(result.finished),
        "output_tokens": tokens,
        "engines": result.engines,
        "mean_engines_busy": round(result.mean_engines_busy, 4),
        "phases": phases,
        **extra,
    }


def routes(result: replay.ReplayResult) -> dict[str, dict[str, float]]:
    """Per route (plan, holdout, probe): its share of the requests, of their client time (start to
    last token) and of the output tokens. Holdout and probes are what measuring costs."""
    requests, seconds, tokens = Counter(), Counter(), Counter()
    for f in result.finished:
        requests[f.route] += 1
        seconds[f.route] += f.ended - f.started
        tokens[f.route] += f.output_tokens
    total = (sum(requests.values()) or 1, sum(seconds.values()) or 1.0, sum(tokens.values()) or 1)
    return {
        route: {
            "requests": requests[route] / total[0],
            "client_time": seconds[route] / total[1],
            "output_tokens": tokens[route] / total[2],
        }
        for route in sorted(requests)
    }


def stationary_actions(decisions: Iterable[dict], scen: scenario_mod.Scenario) -> int:
    """Plan changes made during phases whose traffic equals the previous phase's."""
    stationary = {scen.phases[i].name for i in scen.stationary_phases()}
    return sum(1 for d in decisions if d.get("phase") in stationary)


def max_changes_per_class_hour(decisions: Iterable[dict]) -> int:
    """The most plan changes one guard class (task, temperature and load bucket) made in any hour."""
    times: dict[tuple, list[float]] = {}
    for d in decisions:
        key = (d["task_type"], d["temperature_bucket"], d["load_bucket"])
        times.setdefault(key, []).append(float(d["time"]))
    worst = 0
    for values in times.values():
        values.sort()
        j = 0
        for i, t in enumerate(values):
            while t - values[j] >= HOUR:
                j += 1
            worst = max(worst, i - j + 1)
    return worst


def moves_per_class(decisions: Iterable[dict]) -> Counter:
    return Counter((d["task_type"], d["temperature_bucket"]) for d in decisions)


def ratio(a: Mapping, b: Mapping, key: str = "throughput_tokens_per_second") -> float | None:
    return a[key] / b[key] if a.get(key) and b.get(key) else None


def phase_ratios(a: Mapping, b: Mapping) -> list[float | None]:
    return [ratio(x, y) for x, y in zip(a["phases"], b["phases"], strict=True)]


def bound(policies: Mapping[str, Mapping], tolerance: float) -> dict:
    """Every row's throughput over the oracle's; ``holds`` when none exceeds 1 + ``tolerance``."""
    oracle = policies["oracle"]
    over = {name: ratio(p, oracle) for name, p in policies.items() if name != "oracle"}
    worst_name = max(over, key=lambda n: over[n] or 0.0)
    worst = over[worst_name] or 0.0
    return {
        "tolerance": tolerance,
        "max_ratio_to_oracle": worst,
        "max_ratio_row": worst_name,
        "holds": worst <= 1.0 + tolerance,
        "ratios_to_oracle": over,
    }
