"""``specguard cost``: relative cost per token from measured times, from the model, or from a profile.

Measured form (docs/concepts.md): ``RC = (T_round / A) / T_base``.
Model form: ``RC = (1 + rho*K) / (1 + alpha*K)`` (bonus-aware); the no-bonus ``(1 + rho*K) / (alpha*K)``
of the acceptance-vs-speedup article (docs/concepts.md#sources) is shown beside it, labelled
"no-bonus, conservative".
Profile form: RC per pool and concurrency (and class) from a calibration profile.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from specguard.errors import ConfigError, ConfigIssue
from specguard.rules import profile as profile_mod
from specguard.rules import whatif

MEASURED_FLAGS = ("round_ms", "base_ms", "accept_length")
MODEL_FLAGS = ("alpha", "rho", "k")


def flag_error(message: str) -> ConfigError:
    """A user's flag mistake: printed as ``Error: specguard cost: <message>``, exit status 2."""
    return ConfigError(ConfigIssue("specguard cost", None, None, "", message))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cost",
        help="relative cost per token (RC): measured, model or calibration-profile form",
        description=(
            "RC = time per output token with speculation / without it, at the same operating point. "
            "RC < 1: speculation pays. Give either the measured form (--round-ms --base-ms "
            "--accept-length), the model form (--alpha --rho --k) or --profile FILE."
        ),
        epilog=(
            "examples:\n"
            "  specguard cost --round-ms 53 --base-ms 18 --accept-length 3 4\n"
            "  specguard cost --alpha 0.6 --rho 0.2 --k 1 2 4\n"
            "  specguard cost --profile sweep-profile.yaml --json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    measured = parser.add_argument_group("measured form")
    measured.add_argument("--round-ms", type=float, help="wall time of one speculative verify round (ms)")
    measured.add_argument("--base-ms", type=float, help="time per token without speculation, same load (ms)")
    measured.add_argument(
        "--accept-length", type=float, nargs="+", metavar="A", help="tokens per round, bonus included (>= 1)"
    )
    model = parser.add_argument_group("model form")
    model.add_argument("--alpha", type=float, help="strict accept rate: accepted / proposed drafts (0..1)")
    model.add_argument(
        "--rho", type=float, help="draft cost per drafted token, as a fraction of T_base (>= 0)"
    )
    model.add_argument("--k", type=int, nargs="+", metavar="K", help="drafts per round (>= 1)")
    model.add_argument(
        "--iid",
        action="store_true",
        help="treat --alpha as i.i.d. per-token acceptance: A = (1 - a^(K+1)) / (1 - a) (an assumption)",
    )
    parser.add_argument("--profile", metavar="FILE", help="calibration profile: RC per pool and concurrency")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    given = {
        "measured": [f for f in MEASURED_FLAGS if getattr(args, f, None) is not None],
        "model": [f for f in MODEL_FLAGS if getattr(args, f, None) is not None],
        "profile": ["profile"] if getattr(args, "profile", None) else [],
    }
    forms = [name for name, flags in given.items() if flags]
    if getattr(args, "iid", False) and "model" not in forms:
        raise flag_error("--iid only applies to the model form (--alpha --rho --k)")
    if len(forms) != 1:
        raise flag_error(
            "give exactly one form: --round-ms/--base-ms/--accept-length (measured), "
            "--alpha/--rho/--k (model) or --profile FILE"
            + (f"; got flags of {', '.join(forms)}" if forms else "")
        )
    form = forms[0]
    if form == "measured":
        result = measured_form(args.round_ms, args.base_ms, args.accept_length)
    elif form == "model":
        result = model_form(args.alpha, args.rho, args.k, iid=args.iid)
    else:
        result = profile_form(profile_mod.load_profile(args.profile))
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=False))
    else:
        print(render(result))
    return 0


def _need(value: Any, flag: str, form: str) -> Any:
    if value is None:
        raise flag_error(f"{flag} is required for the {form} form")
    return value


def _positive(value: float, flag: str) -> float:
    if not math.isfinite(value) or value <= 0:
        raise flag_error(f"{flag} ({value:g}) must be a positive number")
    return value


def _verdict(rc: float | None) -> str:
    if rc is None:
        return "unknown"
    return "pays" if rc < 1 else ("breaks even" if rc == 1 else "loses")


def measured_form(
    round_ms: float | None, base_ms: float | None, accept: list[float] | None
) -> dict[str, Any]:
    round_ms = _positive(_need(round_ms, "--round-ms", "measured"), "--round-ms")
    base_ms = _positive(_need(base_ms, "--base-ms", "measured"), "--base-ms")
    rows = []
    for a in _need(accept, "--accept-length", "measured"):
        if not math.isfinite(a) or a < 1:
            raise flag_error(f"--accept-length ({a:g}) must be >= 1 (tokens per round, bonus included)")
        rc = whatif.measured_rc(round_ms, base_ms, a)
        rows.append(
            {
                "accept_length": a,
                "tpot_seconds": round_ms / a / 1000.0,
                "rc": rc,
                "speedup": 1.0 / rc,
                "verdict": _verdict(rc),
            }
        )
    return {
        "form": "measured",
        "formula": "RC = (T_round / A) / T_base",
        "round_seconds": round_ms / 1000.0,
        "base_seconds": base_ms / 1000.0,
        "rows": rows,
    }


def model_form(
    alpha: float | None, rho: float | None, ks: list[int] | None, *, iid: bool = False
) -> dict[str, Any]:
    alpha = _need(alpha, "--alpha", "model")
    rho = _need(rho, "--rho", "model")
    ks = _need(ks, "--k", "model")
    if not math.isfinite(alpha) or not 0 <= alpha <= 1:
        raise flag_error(f"--alpha ({alpha:g}) must be between 0 and 1 (accepted / proposed drafts)")
    if not math.isfinite(rho) or rho < 0:
        raise flag_error(f"--rho ({rho:g}) must be >= 0 (draft cost per token / T_base)")
    rows = []
    for k in ks:
        if k < 1:
            raise flag_error(f"--k ({k}) must be >= 1 (use RC = 1 for no speculation)")
        accept = whatif.iid_accept_length(alpha, k) if iid else 1.0 + alpha * k
        rc = (1.0 + rho * k) / accept
        conservative = None if iid else whatif.model_rc_no_bonus(alpha, rho, k)
        rows.append(
            {
                "k": k,
                "accept_length": accept,
                "round_cost": 1.0 + rho * k,
                "rc": rc,
                "speedup": 1.0 / rc,
                "verdict": _verdict(rc),
                "no_bonus_conservative_rc": conservative,
            }
        )
    formula = (
        "RC = (1 + rho*K) / A,  A = (1 - a^(K+1)) / (1 - a)" if iid else "RC = (1 + rho*K) / (1 + alpha*K)"
    )
    return {
        "form": "model-iid" if iid else "model",
        "formula": formula,
        "no_bonus_formula": None
        if iid
        else "(1 + rho*K) / (alpha*K)  [no bonus token counted: conservative]",
        "alpha": alpha,
        "rho": rho,
        "rows": rows,
    }


def profile_form(profile: profile_mod.Profile) -> dict[str, Any]:
    base_pool = profile.pool(k=0)
    if base_pool is None:
        raise flag_error(f"{profile.source}: no pool with num_speculative_tokens 0, so RC has no baseline")
    base = {level.concurrency: level.tpot_seconds for level in base_pool.levels}
    rows = []
    for pool in profile.pools:
        if pool.num_speculative_tokens == 0:
            continue
        for level in pool.levels:
            t_base = base.get(level.concurrency)
            row: dict[str, Any] = {
                "pool": pool.name,
                "k": pool.num_speculative_tokens,
                "concurrency": level.concurrency,
                "tpot_seconds": level.tpot_seconds,
                "base_tpot_seconds": t_base,
                "rc": level.tpot_seconds / t_base if t_base else None,
                "accept_length": level.accept_length,
                "classes": [],
            }
            for cls in level.classes:
                rc = cls.tpot_seconds / t_base if t_base and cls.tpot_seconds else None
                row["classes"].append(
                    {
                        "task_type": cls.task_type,
                        "temperature_bucket": cls.temperature_bucket,
                        "rc": rc,
                        "accept_length": cls.accept_length,
                        "samples": cls.samples,
                    }
                )
            row["verdict"] = _verdict(row["rc"])
            rows.append(row)
    return {"form": "profile", "source": profile.source, "baseline_pool": base_pool.name, "rows": rows}


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def render(result: dict[str, Any]) -> str:
    lines: list[str] = []
    if result["form"] == "measured":
        lines.append(f"measured form: {result['formula']}")
        t_round, t_base = result["round_seconds"] * 1000, result["base_seconds"] * 1000
        lines.append(f"T_round {t_round:.2f} ms, T_base {t_base:.2f} ms/token")
        lines.append(f"{'A':>6}  {'ms/token':>8}  {'RC':>6}  {'speedup':>7}  verdict")
        for r in result["rows"]:
            lines.append(
                f"{r['accept_length']:>6.2f}  {r['tpot_seconds'] * 1000:>8.2f}  {r['rc']:>6.3f}  "
                f"{r['speedup']:>6.2f}x  {r['verdict']}"
            )
    elif result["form"].startswith("model"):
        lines.append(f"model form: {result['formula']}")
        lines.append(f"alpha {result['alpha']:g}, rho {result['rho']:g}")
        header = f"{'K':>3}  {'A':>6}  {'RC':>6}  {'speedup':>7}  {'verdict':<11}"
        if result["no_bonus_formula"]:
            header += "  no-bonus, conservative RC"
        lines.append(header)
        for r in result["rows"]:
            line = f"{r['k']:>3}  {r['accept_length']:>6.3f}  {r['rc']:>6.3f}  {r['speedup']:>6.2f}x  "
            line += f"{r['verdict']:<11}"
            if result["no_bonus_formula"]:
                value = r["no_bonus_conservative_rc"]
                line += f"  {'inf' if value is None else format(value, '.3f')}"
            lines.append(line)
        if result["no_bonus_formula"]:
            lines.append(f"no-bonus form: {result['no_bonus_formula']}; use the bonus-aware RC to decide")
        lines.append("the model is for explanation and what-if; decide on measured RC on this stack")
    else:
        base = result["baseline_pool"]
        lines.append(f"profile {result['source']}: RC = TPOT(pool, concurrency) / TPOT({base}, same)")
        lines.append(f"{'pool':<14} {'K':>2} {'conc':>5}  {'RC':>6}  {'A':>5}  classes (RC)")
        for r in result["rows"]:
            classes = ", ".join(
                f"{c['task_type']}/{c['temperature_bucket']} {_fmt(c['rc'])}" for c in r["classes"]
            )
            lines.append(
                f"{r['pool']:<14} {r['k']:>2} {r['concurrency']:>5}  {_fmt(r['rc']):>6}  "
                f"{_fmt(r['accept_length'], '.2f'):>5}  {classes}"
            )
    return "\n".join(line.rstrip() for line in lines)
