"""``specguard demo``: calibrate, run the guard through a scripted scenario, compare with baselines."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path

from specguard import columns as columns_mod
from specguard.cli import demo_table
from specguard.cli.commands import simulate
from specguard.cli.demo_table import fmt
from specguard.errors import ConfigError, ConfigIssue


def flag_error(message: str) -> ConfigError:
    """A bad command-line flag: ``--flag rest`` -> ``Error: --flag: rest``."""
    flag, _, rest = message.partition(" ")
    return ConfigError(ConfigIssue(flag.rstrip(":"), None, None, "", rest))


WIDTH = 100


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="see specguard work on the built-in simulator (no GPU, a few minutes)",
        description=(
            "Calibrate the simulated pools with a sweep of their own mix, run a scripted scenario (mixed "
            "classes, load rising into saturation and back, a temperature shift) through specguard's "
            "router, statistics, cost model and guard, then replay the same scenario and seed under "
            "always- and never-speculate, the best single pool, the best in-engine K schedule, the best "
            "static plan per class and the hindsight oracle, every one on the same engines (the fleet "
            "shape: fixed replicas per pool by default), and compare throughput and TPOT."
        ),
    )
    parser.add_argument(
        "--duration", type=float, default=120.0, help="wall seconds to aim for (0 = as fast as possible)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed -> same run)")
    parser.add_argument(
        "--scenario",
        default="default",
        help="built-in scenario (default, shift, load-wave, stationary) or a YAML file",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="specguard config (pools/classes/tap/guard); default: the shipped example with the shipped "
        "guard policy",
    )
    parser.add_argument("--sim-config", default=None, help="simulator config YAML (default: the shipped one)")
    parser.add_argument(
        "--timer-scale", type=float, default=1 / 3, help="multiply the guard policy's timers (default 1/3)"
    )
    parser.add_argument(
        "--fleet-shape",
        choices=("fixed", "autoscaled", "fluid"),
        default="fixed",
        help="fixed: replicas per pool, never moved (what deploy/kubernetes ships; the default); "
        "autoscaled: each pool scaled on its requests in flight by an HPA-like rule, with a start delay; "
        "fluid: N engines moved between pools at once (an idealisation no engine offers)",
    )
    parser.add_argument(
        "--replicas",
        default=None,
        help="fixed: replicas per pool, POOL=N,... or 2xK4+1xK2+1xnospec (the default), 3xK4+1xnospec, "
        "4xK4+2xK2+2xnospec; autoscaled: the pools it runs (each from one replica)",
    )
    parser.add_argument(
        "--fleet",
        type=int,
        default=None,
        help="engines: the fluid fleet (default 4; at least the number of pools) or the autoscaled "
        "budget (default 8)",
    )
    parser.add_argument(
        "--start-delay",
        type=float,
        default=120.0,
        help="autoscaled: seconds before a new replica serves (default 120)",
    )
    parser.add_argument(
        "--scale-down-stabilisation",
        type=float,
        default=300.0,
        help="autoscaled: the HPA's scale-down stabilisation window in seconds (default 300)",
    )
    parser.add_argument(
        "--gpu-scale",
        type=float,
        default=2.0,
        help="simulate a GPU this many times smaller, with the scenario's clients and the load buckets "
        "scaled alike (same RC curves, fewer requests to drive; default 2)",
    )
    parser.add_argument(
        "--live",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run specguard live over HTTP (simulator + tap + exporter + guard daemon); "
        "--no-live: only its virtual-time replay",
    )
    parser.add_argument("--profile-out", default=None, help="also write the calibration profile here")
    parser.add_argument(
        "--stale-world",
        default="k4-dominates",
        help="simulator world (shipped name or simulator config file) the stale calibration profile is "
        "swept on (default k4-dominates)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the result as JSON (stable keys) instead of tables"
    )
    parser.set_defaults(func=run)


def _setup(args: argparse.Namespace):
    from specguard.lab import demo, scenario, shapes, worlds
    from specguard.monitor import config as monitor_config
    from specguard.rules import policy as policy_mod
    from specguard.sim import config as sim_config

    if args.duration < 0:
        raise flag_error(f"--duration ({args.duration}) must be >= 0")
    if not 0 < args.timer_scale <= 10:
        raise flag_error(f"--timer-scale ({args.timer_scale}) must be in (0, 10]")
    if args.fleet is not None and args.fleet < 1:
        raise flag_error(f"--fleet ({args.fleet}) must be >= 1")
    if not 1 <= args.gpu_scale <= 64:
        raise flag_error(f"--gpu-scale ({args.gpu_scale}) must be in [1, 64]")
    cfg = monitor_config.load(args.config) if args.config else monitor_config.load_default()
    sim = sim_config.load(args.sim_config)
    sim_pools = {p.name for p in sim.pools}
    missing = [p.name for p in cfg.exporter.pools if p.name not in sim_pools]
    if missing:
        raise ConfigError(f"config pools {missing} are not simulator pools ({sorted(sim_pools)})")
    names = [p.name for p in cfg.exporter.pools]
    if args.fleet_shape == "fluid" and args.fleet is not None and args.fleet < len(names):
        raise flag_error(
            f"--fleet ({args.fleet}) must be >= the number of pools ({len(names)}): "
            "every pool needs an engine of its own"
        )
    if args.fleet_shape == "fixed" and args.fleet is not None:
        raise flag_error("--fleet: a fixed fleet's engines are its --replicas")
    if args.replicas and args.fleet_shape == "fluid":
        raise flag_error("--replicas: a fluid fleet moves engines between pools; give --fleet N")
    try:
        shape = shapes.build(
            args.fleet_shape,
            names,
            replicas=args.replicas,
            engines=args.fleet,
            start_delay_s=args.start_delay,
            stabilization_s=args.scale_down_stabilisation,
        ).scaled(args.gpu_scale)
        exporter = demo.for_shape(demo.smaller_buckets(cfg.exporter, args.gpu_scale), shape)
    except ValueError as exc:
        raise flag_error(f"--replicas: {exc}") from exc
    stale = worlds.load(args.stale_world)
    stale_missing = [p.name for p in cfg.exporter.pools if p.name not in {q.name for q in stale.pools}]
    if stale_missing:
        raise ConfigError(f"--stale-world {args.stale_world}: no pools {stale_missing}")
    # the shipped example's guard section is tuned for hand runs at --time-scale 0.1; the demo scales
    # the shipped policy's timers itself (--timer-scale), so only a config of the user's sets its policy
    guard_section = cfg.sections.get("guard") if args.config else None
    policy = guard_section if isinstance(guard_section, policy_mod.Policy) else policy_mod.load_default()
    scen = scenario.load_scenario(args.scenario)
    if args.gpu_scale != 1:
        scen = scen.with_clients_scaled(1 / args.gpu_scale)
    setup = demo.DemoSetup(
        sim=demo.smaller_gpu(sim, args.gpu_scale),
        exporter=exporter,
        policy=policy,
        scenario=scen,
        seed=args.seed,
        fleet=shape.size,
        shape=shape,
        timer_scale=args.timer_scale,
        gpu_scale=args.gpu_scale,
        policy_source=f"{args.config} guard:" if guard_section is not None else "rules/default-policy.yaml",
        stale_sim=demo.smaller_gpu(stale, args.gpu_scale),
        stale_world=args.stale_world,
    )
    setup.settings = demo.cost_settings(setup.exporter)
    return setup


class Display:
    """Live lines: an in-place status block on a terminal, plain timestamped lines otherwise."""

    def __init__(self, stream, quiet: bool):
        self.stream = stream
        self.quiet = quiet
        self.tty = stream.isatty() and os.environ.get("TERM") != "dumb"
        self.width = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns) if self.tty else WIDTH
        self._block = 0
        self._last_plain = -1e9

    def line(self, text: str) -> None:
        if self.quiet:
            return
        self._clear()
        print(text[: self.width] if self.tty else text, file=self.stream, flush=True)

    def _clear(self) -> None:
        if self.tty and self._block:
            self.stream.write(f"\x1b[{self._block}A\x1b[J")
            self._block = 0

    def status(self, now: float, phase: str, rows: list[str]) -> None:
        if self.quiet:
            return
        if self.tty:
            self._clear()
            block = [f"t={now:5.0f}s  phase {phase}", *rows]
            for text in block:
                print(text[: self.width], file=self.stream)
            self.stream.flush()
            self._block = len(block)
        elif now - self._last_plain >= 60:
            self._last_plain = now
            print(f"[t={now:5.0f}s] phase {phase}", file=self.stream)
            for text in rows:
                print(f"  {text}", file=self.stream)
            self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self._block = 0


def _rows(costs, states, ks, order=()) -> list[str]:
    """The live status block: a class per line, its RC with a space before its interval (a too-wide
    interval is "not enough evidence", not a number) and a "!" where the model baseline's RC
    contradicts a measured one at a neighbouring load."""
    from specguard.rules import rcquality

    best = {}
    for c in costs:
        key = (c.task_type, c.temperature_bucket, c.load_bucket)
        if c.n_spec and (key not in best or c.n_spec > best[key].n_spec):
            best[key] = c
    cells = [("class", "load", "RC [interval]", "A", "rollbk", "n", "pool (K)", "base")]
    flagged = 0
    rank = {name: i for i, name in enumerate(order)}
    for key in sorted(best, key=lambda k: (k[0], k[1], rank.get(k[2], len(rank)), k[2])):
        c = best[key]
        state = states.get(key)
        pool = state.pool if state is not None and state.pool else "?"
        evidence, _ = rcquality.grade(c, costs, order)
        rc = rcquality.shown(c.rc, c.lower, c.upper, state=evidence)
        if evidence == rcquality.CONTRADICTED:
            rc += " !"
            flagged += 1
        cells.append(
            (
                f"{key[0]}/{key[1]}",
                key[2],
                rc,
                fmt(c.accept_length, ".2f"),
                fmt(c.full_rollback_round_ratio, ".2f"),
                str(c.n_spec),
                f"{pool} ({ks.get(pool, '?')})",
                c.baseline_source,
            )
        )
    rows = columns_mod.aligned(cells)
    if flagged:
        rows.append("! model-baseline RC against a measured loss at a lower load (or a gain at a higher one)")
    return rows


def _decision_lines(d: dict, width: int = WIDTH) -> list[str]:
    """A plan change: one headline, then its whole reason wrapped under it (never cut)."""
    numbers = d.get("numbers", {})
    rc = None
    for name, values in (numbers.get("rules") or {}).items():
        if name.startswith("relative-cost@") and "value" in values:
            rc = values["value"]
            break
    rc_text = f" rc_lower={rc:.2f}" if rc is not None else ""
    head = (
        f">> t={d['time']:5.0f}s {d['action'].upper():<8} {d['task_type']}/{d['temperature_bucket']} "
        f"load={d['load_bucket']}: {d['from']} -> {d['to']}{rc_text}"
    )
    why = textwrap.wrap(
        d.get("reason") or "",
        width,
        initial_indent="     ",
        subsequent_indent="       ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [head, *why]


class Narrator:
    """Prints plan changes; the profile's warm starts of one evaluation as one block per pool.

    With a profile the first evaluation plans every (class, load bucket) the profile knows, most of
    them before any request of theirs: one line each would bury the moves that live evidence made.
    """

    def __init__(self, out: Display, order: list[str]):
        self.out = out
        self.order = {name: i for i, name in enumerate(order)}
        self.held: list[dict] = []

    def decision(self, d: dict) -> None:
        if self.held and d["time"] != self.held[0]["time"]:
            self.flush()
        if d.get("cause") == "profile":
            self.held.append(d)
        else:
            for text in _decision_lines(d, self.out.width):
                self.out.line(text)

    def flush(self) -> None:
        if not self.held:
            return
        held, self.held = self.held, []
        self.out.line(
            f">> t={held[0]['time']:5.0f}s PROFILE  {len(held)} (class, load bucket)s with no live evidence "
            "yet: the profile's cheapest pool"
        )
        by_pool: dict[str, dict[str, list[str]]] = {}
        for d in held:
            name = f"{d['task_type']}/{d['temperature_bucket']}"
            by_pool.setdefault(d["to"], {}).setdefault(name, []).append(d["load_bucket"])
        for pool in sorted(by_pool):
            classes = by_pool[pool]
            text = ", ".join(
                f"{name} ({' '.join(sorted(loads, key=lambda b: self.order.get(b, len(self.order))))})"
                for name, loads in sorted(classes.items())
            )
            first = f"     -> {pool}: "
            for row in textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=" " * 8):
                self.out.line(row)


LIVE_SHARE = 0.7
"""The share of ``--duration`` the live run is paced to (the replays after it run unpaced)."""


def live_budget(duration: float) -> float:
    """Wall seconds the live run aims at for ``--duration`` (0: as fast as possible)."""
    return max(10.0, duration * LIVE_SHARE) if duration else 0.0


INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as a shell reports it."""


def run(args: argparse.Namespace) -> int:
    """The demo; Ctrl-C stops it with what was done so far said, and exit status 130."""
    done: list[str] = []
    try:
        return _run(args, done)
    except KeyboardInterrupt:
        finished = "; ".join(done) if done else "nothing yet (the calibration was under way)"
        print(
            f"\ninterrupted (Ctrl-C): done so far: {finished}. The comparison needs every part; "
            "`specguard demo --no-live` skips the live run, `--duration 0` the pacing.",
            file=sys.stderr,
            flush=True,
        )
        return INTERRUPTED


def _run(args: argparse.Namespace, done: list[str]) -> int:
    from specguard.lab import demo
    from specguard.rules import profile as profile_mod

    started = time.monotonic()
    setup = _setup(args)
    # the daemon's and the scheduler's warnings would tear the live display; errors still show
    for name in ("apscheduler", "specguard", "aiohttp"):
        logging.getLogger(name).setLevel(logging.ERROR)
    out = Display(sys.stdout, quiet=args.json)
    scen = setup.scenario
    ks = {p.name: p.num_speculative_tokens for p in setup.exporter.pools}
    out.line(
        f"specguard demo: scenario '{scen.name}' ({scen.duration_s:.0f} simulated s): {scen.description}"
    )
    out.line(
        f"pools: {', '.join(f'{p} (K={k})' for p, k in ks.items())}; seed {setup.seed}; "
        f"guard timers x{setup.timer_scale:.2f}"
    )
    out.line(f"engines: {demo_table.capacity_statement(setup.fleet_shape)}")
    out.line(
        f"1/3 calibrating: quick sweep of every pool at concurrency 1..{128 / setup.gpu_scale:.0f} "
        "(virtual time) with the sweep's own mix and seed; a stale one on world "
        f"'{setup.stale_world}'"
    )
    profile = demo.calibrate(setup)
    stale_profile = demo.calibrate(setup, sim=setup.stale_sim) if setup.stale_sim is not None else None
    done.append(f"calibration ({len(profile.pools[0].levels)} concurrency levels per pool)")
    if args.profile_out:
        profile_mod.write_profile(profile, Path(args.profile_out))
        out.line(f"    calibration profile written to {args.profile_out}")

    order = [b.name for b in setup.exporter.classes.load_buckets]
    narrator = Narrator(out, order)
    live = None
    if args.live:
        from specguard.lab import demo_live

        budget = live_budget(args.duration)
        time_scale = demo_live.pick_time_scale(scen.duration_s, budget)
        out.line(
            f"2/3 specguard LIVE: simulator pools over HTTP + tap + exporter + guard daemon, "
            f"{time_scale:.2f} wall s per simulated s"
        )

        def on_status(now, phase, costs, states, late=None) -> None:
            narrator.flush()
            rows = _rows(costs, states, ks, order)
            if late:
                rows.append(simulate.lateness_warning(late, time_scale))
            out.status(now, phase, rows)

        live = asyncio.run(
            demo_live.run_live(
                setup,
                profile,
                time_scale=time_scale,
                on_status=on_status,
                on_decision=narrator.decision,
            )
        )
        narrator.flush()
        out.done()
        out.line(
            f"    live: {live['requests']} requests through the tap, {live['actions']} plan changes, "
            f"{live['failed_requests']} failed"
        )
        done.append(f"the live run ({live['requests']} requests, {live['actions']} plan changes)")
        behind = live["simulator_schedule"]
        if behind["late_checks"]:
            out.line(
                f"    warning: the simulator ran behind its time scale at {behind['late_checks']} of "
                f"{behind['checks']} checks (up to {behind['worst_stretch']:.2f}x; a busy CPU): the live "
                "run's times and RC were skewed then; the replays below run in virtual time and are not"
            )
        pace = 0.0
    else:
        out.line("2/3 specguard (virtual time): router + windowed stats + cost model + guard")
        pace = (args.duration * 0.6) / scen.duration_s if args.duration else 0.0
    t0 = time.monotonic()
    guard_ref: dict = {}

    def on_tick(now, costs, changed) -> None:
        if args.live:
            return
        if pace:
            delay = t0 + now * pace - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        for d in changed:
            narrator.decision(d)
        narrator.flush()
        phase = scen.phases[scen.phase_at(now)].name
        out.status(now, phase, _rows(costs, guard_ref["policy"].states, ks, order))

    if args.live:
        out.line("3/3 replaying the same scenario and seed in virtual time: specguard and the baselines")
    result, guard = demo.run_specguard(
        setup, profile, on_tick=on_tick, on_start=lambda g: guard_ref.update(policy=g)
    )
    out.done()
    rows = {"specguard": demo.specguard_row(setup, result, guard, "fresh")}
    realised = {"specguard": guard.choices}
    out.line(f"    specguard replay: {len(result.decisions)} plan changes in {guard.evaluations} evaluations")
    done.append(f"the specguard replay ({len(result.decisions)} plan changes)")
    for key, variant, prof in (
        ("specguard_no_profile", "none", None),
        ("specguard_stale_profile", "stale", stale_profile),
    ):
        if variant == "stale" and prof is None:
            continue
        out.line(f"    replaying specguard with {'no' if prof is None else 'the stale'} profile")
        other, other_guard = demo.run_specguard(setup, prof)
        rows[key] = demo.specguard_row(setup, other, other_guard, variant)
        realised[key] = other_guard.choices
        done.append(f"the replay with {'no' if prof is None else 'the stale'} profile")
    if not args.live:
        out.line("3/3 replaying the same scenario and seed under the baselines")

    started_replay: list[str] = []

    def progress(text: str) -> None:
        if started_replay:  # the one before this has finished
            done.append(started_replay.pop().replace("replaying", "replayed", 1))
        started_replay.append(text)
        out.line(f"    {text}")

    compared = demo.compare(setup, rows, progress=progress, realised=realised)
    result_json = {
        "scenario": demo.scenario_json(scen),
        "seed": setup.seed,
        "capacity": {
            "engines": setup.fleet_shape.size,
            "statement": demo_table.capacity_statement(setup.fleet_shape),
        },
        "fleet_shape": setup.fleet_shape.to_json(),
        "fleet_engines": setup.fleet_shape.size,
        "pools": ks,
        "guard_policy": {"source": setup.policy_source, "timer_scale": setup.timer_scale},
        "calibration": {
            "levels": [lv.concurrency for lv in profile.pools[0].levels],
            "pools": [p.name for p in profile.pools],
            "mix": [[m.task_type, m.temperature] for m in demo.sweep_mix(setup.sim, setup.buckets)],
            "seed": setup.seed + demo.CALIBRATION_SEED,
            "sees_the_scenario": False,
            "stale_world": setup.stale_world,
        },
        "specguard_mode": demo.SPECGUARD_MODE,
        **compared,
        "gpu_scale": args.gpu_scale,
        "specguard_live": live,
        "wall_seconds": round(time.monotonic() - started, 2),
    }
    if args.json:
        json.dump(result_json, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        demo_table.print_comparison(result_json)
    return 0
