"""Model-baseline accuracy: TPOT_base and RC at loads the no-spec pool never ran, against the truth.

For each simulator world (the default, plus worlds of our own), a virtual-time replay runs closed-loop
traffic through the tap's ``Router`` with a fixed 5% holdout (the share holdout of earlier
releases), so the no-spec pool only ever runs at low load while the speculative pools (K=4 for most
classes, K=2 for chat) run at low, medium and high load. One replica per pool, a fixed fleet. For
each phase, the window's records go through ``rules.modelbase.fit`` (the ``model`` baseline the
cost model uses when no live or fresh profile baseline exists) and the prediction for every load
bucket the no-spec pool never ran at is compared with the simulator's truth (``sim.truth.model_table``,
the JSON ``GET /sim/truth`` serves): the no-spec step time at the bucket's load (one token per step:
TPOT_base) and each class's true RC there. Reported per world, bucket and class: relative errors
and whether the truth lies in the model's 95% interval (coverage).

Since the model is not read more than ``modelbase.EXTRAPOLATION_FACTOR`` (2x) beyond the loads the
no-spec pool ran at, each cell says whether it is within that reach (outside it the cost model has
no model baseline: ``none``); the errors are given for every cell, read without the limit, so what
the limit declines is measured too.

Goals: |error| <= 10% at medium load and <= 15% at high load, in the default world and
the worlds ``expensive-draft`` and ``early-knee``; ``saturating`` is a stress world beyond them (the
no-spec pool itself turns compute-bound at loads it never ran at).

The truth for TPOT_base is the no-spec pool's own TPOT at that load, measured by running it there
(closed-loop, same mix, one engine: ``live_truth``), i.e. what a live baseline would have said; the
errors against the pure step-cost table of ``/sim/truth`` (which leaves out the prefills every step
also carries) are reported next to it.

    python3 bench/bench_model_baseline.py [--worlds default,expensive-draft,early-knee] [--seeds 0,1]
        [--phase-seconds 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np

from specguard.exporters import routing
from specguard.lab import replay, scenario
from specguard.lab import replay_policies as rp
from specguard.monitor import config as monitor_config
from specguard.rules import modelbase
from specguard.sim import config as sim_config
from specguard.sim import truth as truth_mod

GOALS = {"medium": 0.10, "high": 0.15}
TEMPERATURES = {"code": 0.0, "extraction": 0.0, "chat": 0.7, "creative": 1.0}
CLIENTS = (12, 24, 40, 64, 96, 120)  # per phase: from low to high load on the speculative pools
Z95 = 1.959964
TAP_WINDOW = 900.0
TRUTH_LEVELS = (
    8,
    16,
    24,
    32,
    40,
    48,
    56,
    64,
    80,
    96,
    112,
    128,
)  # tap.window_seconds: the records the model baseline is fitted on


def worlds() -> dict[str, sim_config.SimConfig]:
    """The default world and two of our own (every true RC curve differs)."""
    base = sim_config.load()
    grid = tuple(range(1, 257))
    base = replace(base, truth_concurrency=grid)
    cost = base.cost
    return {
        "default": base,
        # a drafter 3x as dear per position and per token: K=4 loses at lower load
        "expensive-draft": replace(
            base,
            cost=replace(
                cost,
                draft_per_position_seconds=cost.draft_per_position_seconds * 3,
                draft_per_token_seconds=cost.draft_per_token_seconds * 3,
            ),
        ),
        # the step turns compute-bound at 96 executed tokens instead of 192: K=4 from B ~ 19 on
        # (half the default's load), K=2 from B = 32 on
        "early-knee": replace(base, cost=replace(cost, knee_tokens=96, above_knee_per_token_seconds=0.00015)),
        # stress: compute-bound from 64 tokens, so the no-spec pool itself saturates from B = 64 on,
        # a knee it never showed at the loads it ran at (only the speculative pools' curvature tells)
        "saturating": replace(base, cost=replace(cost, knee_tokens=64, above_knee_per_token_seconds=0.00015)),
    }


def traffic(phase_seconds: float, levels: tuple[int, ...] = CLIENTS) -> scenario.Scenario:
    phases = []
    for clients in levels:
        share = {"code": 0.3, "extraction": 0.2, "chat": 0.3, "creative": 0.2}
        loads = tuple(
            scenario.ClassLoad(task, max(1, round(clients * w)), ((TEMPERATURES[task], 1.0),))
            for task, w in share.items()
        )
        phases.append(scenario.Phase(f"{clients}-clients", phase_seconds, loads))
    return scenario.Scenario("model-baseline", tuple(phases))


class HoldoutPolicy(rp.StaticPolicy):
    """A fixed plan (chat on K=2, the rest on K=4) with a fixed 5% holdout to the no-spec pool."""

    def __init__(self, seed: int, share: float = 0.05, pool: str = "spec-k4"):
        plan = {("chat", "medium"): "spec-k2"} if pool != "nospec" else {}
        super().__init__("holdout-5pct", pool, plan)
        self._rng = np.random.default_rng(seed)
        self.share = share
        self.records = []

    def choose(self, task_type, temperature_bucket, load_bucket_of, load_of=None):
        pool, _ = super().choose(task_type, temperature_bucket, load_bucket_of)
        if self._rng.random() < self.share:
            return "nospec", routing.ROUTE_HOLDOUT
        return pool, "plan"

    def observe(self, record) -> None:
        self.records.append(record)


def live_truth(sim: sim_config.SimConfig, seed: int, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """The no-spec pool's own TPOT by load, measured by running it there: (loads, TPOT seconds).

    Closed-loop clients of the bench's mix on one no-spec engine at each level; TPOT is the ratio
    of sums over the settled part, the load the decode-weighted mean load while decoding.
    """
    cfg = monitor_config.load_default()
    buckets = replay.Buckets.from_classes(cfg.exporter.classes)
    loads, tpots = [], []
    for clients in TRUTH_LEVELS:
        scen = traffic(seconds, (clients,))
        recorder = HoldoutPolicy(seed, share=0.0, pool="nospec")
        replay.Replay(
            sim, scen, recorder, buckets, seed=seed + 7, pools=["nospec"], fixed=True, replicas={"nospec": 1}
        ).run()
        settled = [r for r in recorder.records if r.started_at >= seconds / 4 and r.decode_load is not None]
        tokens = np.array([r.output_tokens - 1 for r in settled], dtype=float)
        loads.append(float(np.average([r.decode_load for r in settled], weights=tokens)))
        tpots.append(sum(r.decode_seconds for r in settled) / tokens.sum())
    return np.array(loads), np.array(tpots)


def truth_at(table: dict, key: str, load: float) -> float:
    """Linear interpolation of a truth curve (``{str(B): value}``) at ``load``."""
    grid = (
        sorted((int(b), v) for b, v in table[key].items())
        if key
        else sorted((int(b), v) for b, v in table.items())
    )
    xs = [b for b, _ in grid]
    ys = [v for _, v in grid]
    return float(np.interp(load, xs, ys))


def decode_weighted_load(records) -> float:
    tokens = [r.output_tokens - 1 for r in records]
    return float(np.average([r.decode_load for r in records], weights=tokens))


def one(world: str, sim: sim_config.SimConfig, seed: int, phase_seconds: float) -> list[dict]:
    cfg = monitor_config.load_default()
    buckets = replay.Buckets.from_classes(cfg.exporter.classes)
    policy = HoldoutPolicy(seed)
    scen = traffic(phase_seconds)
    replay.Replay(
        sim, scen, policy, buckets, seed=seed, fixed=True, replicas={"spec-k4": 1, "spec-k2": 1, "nospec": 1}
    ).run()
    ks = {p.name: p.num_speculative_tokens for p in sim.pools}
    table = truth_mod.model_table(sim)
    truth_loads, truth_tpots = live_truth(sim, seed, phase_seconds)
    rows = []
    for start, end, phase in scen.boundaries():
        # the fit sees the tap's window (900 s); the prediction is for this phase's settled part
        window = [r for r in policy.records if end - TAP_WINDOW <= r.started_at < end]
        settled = [
            r for r in window if r.started_at >= start + phase_seconds / 3 and r.decode_load is not None
        ]
        nospec_buckets = {r.load_bucket for r in policy.records if r.pool == "nospec" and r.started_at < end}
        fitted = modelbase.fit(window, ks)
        for bucket in ("medium", "high"):
            if bucket in nospec_buckets:
                continue  # the no-spec pool ran here: a live baseline exists, nothing to predict
            spec = [r for r in settled if r.load_bucket == bucket and ks[r.pool] > 0]
            if len(spec) < 30:
                continue
            load = decode_weighted_load(spec)
            row = {"world": world, "seed": seed, "phase": phase.name, "bucket": bucket, "load": load}
            if isinstance(fitted, str):
                rows.append({**row, "error": fitted})
                continue
            # read past the model's reach too (limited=False), to show what the limit declines
            row["within_reach"] = fitted.reach(load) is None
            value, log_var = fitted.tpot(load, limited=False)
            sd = math.sqrt(log_var)
            live = float(np.interp(load, truth_loads, truth_tpots))
            pure = truth_at(table["nospec_step_seconds"], "", load)
            row.update(
                {
                    "tpot_base_ms": value * 1000,
                    "true_tpot_base_ms": live * 1000,
                    "sim_truth_step_ms": pure * 1000,
                    "tpot_error": value / live - 1,
                    "tpot_error_vs_sim_truth_table": value / pure - 1,
                    "tpot_covered": abs(math.log(value / live)) <= Z95 * sd,
                    "interval_halfwidth": Z95 * sd,
                    "knee": fitted.best.knee,
                    "classes": [],
                }
            )
            by_class = defaultdict(list)
            for r in spec:
                by_class[(r.task_type, r.pool)].append(r)
            for (task, pool), recs in sorted(by_class.items()):
                if len(recs) < 30:
                    continue
                spec_tpot = sum(r.decode_seconds for r in recs) / sum(r.output_tokens - 1 for r in recs)
                class_load = decode_weighted_load(recs)
                base, class_var = fitted.tpot(class_load, limited=False)
                rc = spec_tpot / base
                true_rc = spec_tpot / float(np.interp(class_load, truth_loads, truth_tpots))
                key = truth_mod.class_key(task, TEMPERATURES[task])
                table_rc = truth_at(table["classes"][key]["pools"][pool], "relative_cost", class_load)
                row["classes"].append(
                    {
                        "class": f"{task}/{pool}",
                        "rc": rc,
                        "true_rc": true_rc,
                        "sim_truth_table_rc": table_rc,
                        "rc_error": rc / true_rc - 1,
                        "rc_error_vs_sim_truth_table": rc / table_rc - 1,
                        "rc_covered": abs(math.log(rc / true_rc)) <= Z95 * math.sqrt(class_var),
                    }
                )
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="default,expensive-draft,early-knee")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--phase-seconds", type=float, default=150.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    known = worlds()
    rows = []
    for name in args.worlds.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            t0 = time.perf_counter()
            found = one(name, known[name], seed, args.phase_seconds)
            rows += found
            if args.json:
                continue
            for row in found:
                if "error" in row:
                    print(
                        f"{name:<16} seed {seed} {row['phase']:<12} {row['bucket']:<7} "
                        f"no model: {row['error']}"
                    )
                    continue
                classes = " ".join(
                    f"{c['class']} {c['rc']:.3f}/{c['true_rc']:.3f} ({c['rc_error']:+.1%}"
                    f"{'' if c['rc_covered'] else ' !'})"
                    for c in row["classes"]
                )
                reach = "" if row["within_reach"] else " (beyond 2x: none)"
                print(
                    f"{name:<16} seed {seed} {row['phase']:<12} {row['bucket']:<7} "
                    f"B={row['load']:5.1f}{reach} "
                    f"TPOT_base {row['tpot_base_ms']:.2f}/{row['true_tpot_base_ms']:.2f} ms "
                    f"({row['tpot_error']:+.1%}, +-{row['interval_halfwidth']:.1%}"
                    f"{'' if row['tpot_covered'] else ' not covered'}) knee {row['knee']} | RC {classes}"
                    f" [{time.perf_counter() - t0:.0f}s]",
                    flush=True,
                )
    summary = summarize(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=2))
    else:
        print(json.dumps(summary, indent=2))


def summarize(rows: list[dict]) -> dict:
    """Per world and load bucket: errors against the truth, interval coverage, the goal."""
    out: dict = {}
    good = [r for r in rows if "error" not in r]
    for world in dict.fromkeys(r["world"] for r in rows):
        per: dict = {}
        for bucket, goal in GOALS.items():
            here = [r for r in good if r["world"] == world and r["bucket"] == bucket]
            if not here:
                continue
            tpot = [abs(r["tpot_error"]) for r in here]
            rc = [abs(c["rc_error"]) for r in here for c in r["classes"]]
            per[bucket] = {
                "cells": len(here),
                "cells_within_reach": sum(1 for r in here if r["within_reach"]),
                "loads": [round(min(r["load"] for r in here), 1), round(max(r["load"] for r in here), 1)],
                "max_abs_tpot_base_error": max(tpot),
                "mean_abs_tpot_base_error": statistics.mean(tpot),
                "max_abs_rc_error": max(rc) if rc else None,
                "mean_abs_rc_error": statistics.mean(rc) if rc else None,
                "max_abs_tpot_base_error_vs_sim_truth_table": max(
                    abs(r["tpot_error_vs_sim_truth_table"]) for r in here
                ),
                "max_abs_rc_error_vs_sim_truth_table": max(
                    (abs(c["rc_error_vs_sim_truth_table"]) for r in here for c in r["classes"]), default=None
                ),
                "tpot_base_coverage": sum(r["tpot_covered"] for r in here) / len(here),
                "rc_coverage": statistics.mean(c["rc_covered"] for r in here for c in r["classes"])
                if rc
                else None,
                "interval_halfwidth": [
                    round(min(r["interval_halfwidth"] for r in here), 3),
                    round(max(r["interval_halfwidth"] for r in here), 3),
                ],
                "goal": goal,
                "goal_met": max(tpot) <= goal and (not rc or max(rc) <= goal),
            }
        per["no_model"] = sum(1 for r in rows if r["world"] == world and "error" in r)
        out[world] = per
    return out


if __name__ == "__main__":
    main()
