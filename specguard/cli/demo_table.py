"""``specguard demo``'s closing comparison: the table of rows, what each knows, and the summary lines."""

from __future__ import annotations

import textwrap

WIDTH = 100


def fmt(value, spec: str, dash: str = "-") -> str:
    return dash if value is None else format(value, spec)


def capacity_statement(shape) -> str:
    """What every row runs on (``lab.shapes.FleetShape``), in a sentence."""
    if shape.kind == "fixed":
        return (
            f"every row runs on the same {shape.size} engines: the routing rows on the fixed pools "
            f"({shape.label().removeprefix('fixed: ')}, never moved), the one-pool rows on all {shape.size}"
        )
    if shape.kind == "autoscaled":
        return f"every row runs on the same engines, {shape.label()}; the one-pool rows as one pool"
    return (
        f"every row runs on the same fleet of {shape.size} engines, whichever pools it uses "
        "(fluid, an idealisation: an empty engine is given to another pool at once, no restart)"
    )


NAMES = {
    "always_speculate": "always speculate",
    "never_speculate": "never speculate",
    "best_single_pool": "best single pool",
    "best_in_engine_schedule": "best K schedule",
    "best_per_phase": "best per phase",
    "best_per_class_static": "best per class",
    "oracle": "oracle",
    "specguard": "specguard",
    "specguard_no_profile": "  no profile",
    "specguard_stale_profile": "  stale profile",
}


def _config(name: str, p: dict) -> str:
    if name.startswith("specguard"):
        warm = p.get("profile_actions")
        return f"{p['actions']} plan changes" + (f" ({warm} from the profile)" if warm else "")
    if name == "best_per_phase":
        return "/".join(p["config"])
    if name == "best_in_engine_schedule":
        return p["label"].split(": ", 1)[-1]
    if name in ("best_per_class_static", "oracle"):
        return "hindsight, true model" + (f", plan of {p['plan_from']}" if p.get("plan_from") else "")
    return p.get("config") or ""


def print_comparison(result: dict) -> None:
    policies = result["policies"]
    from specguard.lab import demo

    names = [n for n in demo.ROWS if n in policies]
    print()
    print(f"Fleet shape: {result['fleet_shape']['label']}.")
    print(f"Same scenario, same seed ({result['seed']}); {result['capacity']['statement']}.")
    print(
        f"{'policy':<18}{'tokens/s':>10}{'vs oracle':>11}{'TPOT mean':>11}{'TPOT p99':>10}"
        f"{'engines':>9}  config"
    )
    oracle = policies["oracle"]["throughput_tokens_per_second"]
    for name in names:
        p = policies[name]
        print(
            f"{NAMES[name]:<18}{p['throughput_tokens_per_second']:>10.0f}"
            f"{p['throughput_tokens_per_second'] / oracle:>10.1%} {fmt(p['tpot_mean_ms'], '8.1f'):>9}ms"
            f"{fmt(p['tpot_p99_ms'], '7.1f'):>8}ms{p['mean_engines_busy']:>9.2f}  {_config(name, p)}"
        )
    print()
    print("Output tokens/s per phase:")
    phases = [ph["name"] for ph in policies["specguard"]["phases"]]
    print(f"{'policy':<18}" + "".join(f"{name[:10]:>11}" for name in phases))
    for name in names:
        print(
            f"{NAMES[name]:<18}"
            + "".join(f"{ph['throughput_tokens_per_second']:>11.0f}" for ph in policies[name]["phases"])
        )
    print()
    print("What each row knows that specguard does not:")
    for name in names:
        if not name.startswith("specguard"):
            print(textwrap.fill(f"{NAMES[name]}: {policies[name]['knows']}", WIDTH, subsequent_indent="  "))
    for line in summary_lines(result):
        print(textwrap.fill(line, WIDTH))
    print(f"Done in {result['wall_seconds']:.0f} s. Use --json for every number.")


def summary_lines(result: dict) -> list[str]:
    """The closing lines: specguard against each row, the bound check and the live run."""
    r, bound, noise = result["ratios"], result["bound"], result["noise"]
    lines = [
        "",
        f"specguard = {r['specguard_vs_oracle_throughput']:.1%} of the oracle, "
        f"{r['specguard_vs_best_single_pool_throughput']:.1%} of the best single pool, "
        f"{r['specguard_vs_best_in_engine_schedule_throughput']:.1%} of the best in-engine K schedule, "
        f"{r['specguard_vs_best_per_class_static_throughput']:.1%} of the best static plan per class, "
        f"{r['specguard_vs_always_speculate_throughput']:.2f}x always-speculate, "
        f"{r['specguard_vs_never_speculate_throughput']:.2f}x never-speculate "
        f"(worst phase vs never: {r['specguard_vs_never_worst_phase_throughput']:.2f}x); "
        f"TPOT p99 {r['specguard_vs_oracle_tpot_p99']:.2f}x the oracle's.",
    ]
    others = [
        f"{label} {r[key]:.1%}"
        for key, label in (
            ("specguard_no_profile_vs_oracle_throughput", "with no profile"),
            ("specguard_stale_profile_vs_oracle_throughput", "with a stale profile"),
        )
        if r.get(key) is not None
    ]
    if others:
        lines.append("Of the oracle: " + ", ".join(others) + " (fresh profile above).")
    lines.append(
        f"Bound: no row beats the oracle by more than the run-to-run noise ({noise['max_abs']:.2%}, "
        f"{noise['method']}): {'holds' if bound['holds'] else 'VIOLATED'} "
        f"(closest: {NAMES[bound['max_ratio_row']].strip()} at {bound['max_ratio_to_oracle']:.1%})."
    )
    lines.append(f"The specguard rows are its {result['specguard_mode']}.")
    live = result.get("specguard_live")
    if live:
        lines.append(
            f"Live run ({live['mode']}): {live['throughput_tokens_per_second']:.0f} tokens/s, "
            f"TPOT mean {fmt(live['tpot_mean_ms'], '.1f')} ms, p99 {fmt(live['tpot_p99_ms'], '.1f')} ms "
            f"(simulated time), {live['actions']} plan changes; {live['note']}."
        )
    return lines
