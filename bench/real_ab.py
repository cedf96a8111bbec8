"""The real tier's number test, kept: the guard's RC per class against an interleaved A/B.

``tests/vllm/test_real_model.py -s`` prints, per measurement, the A/B's RC and the guard's with
their intervals and the RC every baseline scope gives on the same records. This script turns those
printed runs into a kept result and the result into docs/real-model.md's tables (a test checks the
page still carries them)::

    python3 -m pytest tests/vllm/test_real_model.py -m vllm -s -k interleaved_ab > run.log
    python3 bench/real_ab.py --parse run.log [more.log ...] > bench/results/real-ab.json
    python3 bench/real_ab.py --parse new.log --onto bench/results/real-ab.json > merged.json  # add runs
    python3 bench/real_ab.py --render bench/results/real-ab.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path
from statistics import NormalDist

RUN = re.compile(r"^=== run (\d+) (\S+) load (\S+) (\S+) (\S+)(?: commit (\S+))?")
SEED = re.compile(r"default baseline scope (\w+); (\d+) prompts per class, seed (\d+)(?:; design (\S+))?")
EARLIER = "one-at-a-time"
"""The design of runs printed before the test named one: the four requests of a prompt in turn."""
CLASS = re.compile(
    r"^(\w+/\w+): A/B RC ([\d.]+) \[([\d.]+), ([\d.]+)\] \((\d+) pairs\) \(TPOT ([\d.]+) / ([\d.]+) ms\); "
    r"guard RC ([\d.]+) \[([\d.]+), ([\d.]+)\] \(TPOT ([\d.]+) / ([\d.]+) ms; .*?by scope: (.*)$"
)
VERDICT = re.compile(r"^attempt (\d+): strict (.*); gross (.*)$")
LEVEL = 0.95
"""Both intervals' confidence level (the A/B's is set to the guard's own)."""
Z = NormalDist().inv_cdf(0.5 + LEVEL / 2)
SHARED = 0.7
"""A z-spread below this: the two measurements share their noise (the intervals assume not)."""


def parse(lines: list[str]) -> list[dict]:
    """Every measurement in the printed runs, in order."""
    out: list[dict] = []
    run: dict = {}
    current: dict | None = None
    for raw in lines:
        line = raw.strip()
        if m := RUN.match(line):
            run = {"run": int(m[1]), "time": m[2], "load": float(m[3]), "commit": m[6]}
        elif m := SEED.search(line):  # pytest's progress may stand before it on the line
            current = {
                **run,
                "default_scope": m[1],
                "prompts": int(m[2]),
                "seed": int(m[3]),
                "design": m[4] or EARLIER,
                "classes": {},
            }
        elif current is not None and (m := CLASS.match(line)):
            scopes = dict(part.rsplit(" ", 1) for part in m[13].split(", "))
            current["classes"][m[1]] = {
                "ab": [float(m[2]), float(m[3]), float(m[4])],
                "ab_tpot_ms": [float(m[6]), float(m[7])],
                "guard": [float(m[8]), float(m[9]), float(m[10])],
                "guard_tpot_ms": [float(m[11]), float(m[12])],
                "scopes": {k: None if v == "none" else float(v) for k, v in scopes.items()},
            }
        elif current is not None and (m := VERDICT.match(line)):
            current["strict"], current["gross"] = m[2], m[3]
            out.append(current)
            current = None
    return out


def verdict_of(text: str, cls: str) -> str:
    """One class's part of a printed verdict ("met", or its misses)."""
    mine = [part.split(": ", 1)[1] for part in text.split("; ") if part.startswith(f"{cls}: ")]
    return "; ".join(mine) or "met"


def off(value: float | None, truth: float) -> str:
    return "none" if value is None else f"{value:.3f} ({value / truth - 1:+.1%})"


def scope_errors(result: list[dict]) -> dict[str, float]:
    """Per baseline scope, the mean absolute distance of its RC from the A/B's, over every class run."""
    errors: dict[str, list[float]] = {}
    for m in result:
        for c in m["classes"].values():
            for scope, value in c["scopes"].items():
                if value is not None:
                    errors.setdefault(scope, []).append(abs(value / c["ab"][0] - 1))
    return {scope: statistics.fmean(e) for scope, e in errors.items()}


def log_sd(interval: list[float]) -> float:
    """The standard deviation of log RC that a LEVEL interval of this width implies."""
    _, lo, hi = interval
    return (math.log(hi) - math.log(lo)) / (2 * Z)


def calibration(result: list[dict]) -> dict[str, float]:
    """Is the guard's RC the A/B's, up to the noise both intervals state?

    ``bias`` is the geometric mean of guard/A/B over every class measurement, with a 90% interval
    over the measurements; ``z`` are the log differences in units of their joint standard deviation
    (unbiased measurements with honest intervals give a standard deviation near 1); ``expected``
    is how many class measurements two unbiased measurements would cover each other's point in,
    given the intervals' own widths (a point falls inside the narrower interval with probability
    P(|N(0, 1)| < Z sd_narrow / sd_joint)), against ``covered``, how many did."""
    logs, zs, expected, covered = [], [], 0.0, 0
    for m in result:
        for c in m["classes"].values():
            (g, gl, gu), (a, al, au) = c["guard"], c["ab"]
            sg, sa = log_sd(c["guard"]), log_sd(c["ab"])
            joint = math.hypot(sg, sa)
            logs.append(math.log(g / a))
            zs.append(logs[-1] / joint)
            expected += 2 * NormalDist().cdf(Z * min(sg, sa) / joint) - 1
            covered += gl <= a <= gu and al <= g <= au
    mean = statistics.fmean(logs)
    half = NormalDist().inv_cdf(0.95) * statistics.stdev(logs) / len(logs) ** 0.5
    return {
        "bias": math.exp(mean),
        "bias_lo": math.exp(mean - half),
        "bias_hi": math.exp(mean + half),
        "z_sd": statistics.pstdev(zs),
        "z_max": max(abs(z) for z in zs),
        "expected": expected,
        "covered": covered,
        "n": len(logs),
    }


DESIGNS = {
    "side-by-side-alternating": "The guard's request beside the A/B's, the prompt cached first, the first to "
    "arrive alternating",
    "side-by-side-warm": "The guard's request beside the A/B's on the same engine, the prompt cached first",
    "side-by-side": "The guard's request beside the A/B's, the prompt not cached first",
    EARLIER: "The four requests of a prompt one at a time",
}
"""How each kept run timed the two sides, newest first (``tests/abcompare.py`` says why)."""


def render(result: list[dict]) -> str:
    runs = [
        "| run | design | class | A/B RC [95%] | guard RC [95%] | apart | strict | gross |",
        "|---|---|---|---|---|---|---|---|",
    ]
    scopes = sorted({s for m in result for c in m["classes"].values() for s in c["scopes"]})
    table = ["| run | class | A/B RC | " + " | ".join(scopes) + " |", "|---|---|---|" + "---|" * len(scopes)]
    for m in result:
        commit = f", {m['commit']}" if m.get("commit") else ""
        name = f"{m['run']}.{m['seed']} ({m['time']}, load {m['load']:.1f}{commit})"
        for cls, c in m["classes"].items():
            (a, al, au), (g, gl, gu) = c["ab"], c["guard"]
            runs.append(
                f"| {name} | {m['design']} | {cls} | {a:.3f} [{al:.3f}, {au:.3f}] | "
                f"{g:.3f} [{gl:.3f}, {gu:.3f}] | {g / a - 1:+.1%} | {verdict_of(m['strict'], cls)} | "
                f"{verdict_of(m['gross'], cls)} |"
            )
            cells = " | ".join(off(c["scopes"].get(s), a) for s in scopes)
            table.append(f"| {name} | {cls} | {a:.3f} | {cells} |")
    parts = []
    for design, title in DESIGNS.items():
        group = [m for m in result if m["design"] == design]
        numbers = sorted({m["run"] for m in group})
        if numbers:
            named = f"run {numbers[0]}" if len(numbers) == 1 else f"runs {', '.join(map(str, numbers))}"
            parts.append(f"**{title}** ({named}): {summary(group)}")
    return "\n".join(runs) + "\n\n" + "\n".join(table) + "\n\n" + "\n\n".join(parts)


def summary(result: list[dict]) -> str:
    """Agreement, the baseline scopes' distances and the calibration of one design's runs."""
    errors = scope_errors(result)
    default = result[0]["default_scope"]
    closest = min(errors.values())
    pairs = [(c["guard"][0], c["ab"][0]) for m in result for c in m["classes"].values()]
    apart = statistics.fmean(abs(g / a - 1) for g, a in pairs)
    ranked = ", ".join(f"{s} {e:.1%}" for s, e in sorted(errors.items(), key=lambda kv: kv[1]))
    best = min(errors, key=errors.get)
    differ = sum(
        c["scopes"].get(best) != c["scopes"].get(default) for m in result for c in m["classes"].values()
    )
    verdict = (
        "it measured closest"
        if errors[default] <= closest
        else f"`{best}` measured closer on these runs (the two differ in {differ} of the {len(pairs)} "
        f"class measurements)"
    )
    ratios = [
        [a / g for a, g in zip(c["ab_tpot_ms"], c["guard_tpot_ms"], strict=True)]
        for m in result
        for c in m["classes"].values()
    ]
    spec, nospec = (math.exp(statistics.fmean(math.log(r[i]) for r in ratios)) for i in (0, 1))
    each = [v for r in ratios for v in r]
    timing = (
        f" The A/B's TPOT over the guard's: × {spec:.3f} on the speculative engine and × {nospec:.3f} on "
        f"the no-spec one (geometric means; from {min(each):.2f} to {max(each):.2f})."
    )
    met = sum(m["strict"] == "met" for m in result)
    classes_met = sum(verdict_of(m["strict"], cls) == "met" for m in result for cls in m["classes"])
    text = (
        f"Strict agreement held in {met} of {len(result)} measurements ({classes_met} of {len(pairs)} "
        f"class measurements); the guard's RC was {apart:.1%} "
        f"from the A/B's on average. Mean distance from the A/B by baseline scope: {ranked}. "
        f"The default is `{default}`: {verdict}.{timing}"
    )
    if len(pairs) < 2:
        return text
    cal = calibration(result)
    unbiased = cal["bias_lo"] <= 1.0 <= cal["bias_hi"]
    noise = unbiased and cal["z_sd"] <= 1.5
    return text + (
        f" Is the guard's number the A/B's, up to the noise? Over the {cal['n']} class measurements "
        f"the guard's RC is the A/B's × {cal['bias']:.3f} (90% interval over the measurements "
        f"[{cal['bias_lo']:.3f}, {cal['bias_hi']:.3f}]): "
        + ("no bias shows" if unbiased else "a bias")
        + f". Their differences, each in units of its joint standard deviation (from the two "
        f"{LEVEL:.0%} intervals), have a standard deviation of {cal['z_sd']:.2f} (1 for unbiased "
        f"measurements with honest intervals), the largest {cal['z_max']:.2f}. Two unbiased "
        f"measurements with these intervals' widths cover each other's point in "
        f"{cal['expected']:.1f} of the {cal['n']} class measurements on average; these covered in "
        f"{cal['covered']}. "
        + (
            "So the two are closer than two independent measurements of the same number: the timing "
            "noise both sides share cancels in their difference."
            if noise and cal["z_sd"] < SHARED
            else "So a strict miss is what two noisy measurements of the same number give now and then."
            if noise
            else "So the misses are more than two noisy measurements of the same number give."
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--parse", nargs="+", metavar="LOG", help="printed runs to a kept result (JSON)")
    group.add_argument("--render", metavar="FILE", help="a kept result to docs/real-model.md's tables")
    parser.add_argument("--onto", metavar="FILE", help="with --parse: the kept result the runs are added to")
    args = parser.parse_args()
    if args.parse:
        lines = [line for path in args.parse for line in Path(path).read_text().splitlines()]
        result = parse(lines)
        if not result:
            sys.exit(f"{', '.join(args.parse)}: no measurement found (run the test with -s)")
        kept = json.loads(Path(args.onto).read_text()) if args.onto else []
        print(json.dumps(kept + result, indent=1))
    else:
        print(render(json.loads(Path(args.render).read_text())))


if __name__ == "__main__":
    main()
