"""The real tier's number test, kept: the guard's RC per class against an interleaved A/B.

``tests/vllm/test_real_model.py -s`` prints, per measurement, the A/B's RC and the guard's with
their intervals and the RC every baseline scope gives on the same records. This script turns those
printed runs into a kept result and the result into docs/real-model.md's tables (a test checks the
page still carries them)::

    SPECGUARD_AB_STRICT=1 python3 -m pytest tests/vllm/test_real_model.py -m vllm -s -k interleaved_ab \
        > run.log
    python3 bench/real_ab.py --parse run.log [more.log ...] > bench/results/real-ab.json
    python3 bench/real_ab.py --render bench/results/real-ab.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

RUN = re.compile(r"^=== run (\d+) (\S+) load (\S+) (\S+) (\S+)(?: commit (\S+))?")
SEED = re.compile(r"^default baseline scope (\w+); (\d+) prompts per class, seed (\d+)")
CLASS = re.compile(
    r"^(\w+/\w+): A/B RC ([\d.]+) \[([\d.]+), ([\d.]+)\] \((\d+) pairs\) \(TPOT ([\d.]+) / ([\d.]+) ms\); "
    r"guard RC ([\d.]+) \[([\d.]+), ([\d.]+)\] \(TPOT ([\d.]+) / ([\d.]+) ms; .*?by scope: (.*)$"
)
VERDICT = re.compile(r"^attempt (\d+): strict (.*); gross (.*)$")


def parse(lines: list[str]) -> list[dict]:
    """Every measurement in the printed runs, in order."""
    out: list[dict] = []
    run: dict = {}
    current: dict | None = None
    for raw in lines:
        line = raw.strip()
        if m := RUN.match(line):
            run = {"run": int(m[1]), "time": m[2], "load": float(m[3]), "commit": m[6]}
        elif m := SEED.match(line):
            current = {**run, "default_scope": m[1], "prompts": int(m[2]), "seed": int(m[3]), "classes": {}}
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


def render(result: list[dict]) -> str:
    runs = [
        "| run | class | A/B RC [95%] | guard RC [95%] | apart | strict | gross |",
        "|---|---|---|---|---|---|---|",
    ]
    scopes = sorted({s for m in result for c in m["classes"].values() for s in c["scopes"]})
    table = ["| run | class | A/B RC | " + " | ".join(scopes) + " |", "|---|---|---|" + "---|" * len(scopes)]
    for m in result:
        name = f"{m['run']}.{m['seed']} ({m['time']}, load {m['load']:.1f})"
        for cls, c in m["classes"].items():
            (a, al, au), (g, gl, gu) = c["ab"], c["guard"]
            runs.append(
                f"| {name} | {cls} | {a:.3f} [{al:.3f}, {au:.3f}] | {g:.3f} [{gl:.3f}, {gu:.3f}] | "
                f"{g / a - 1:+.1%} | {verdict_of(m['strict'], cls)} | {verdict_of(m['gross'], cls)} |"
            )
            cells = " | ".join(off(c["scopes"].get(s), a) for s in scopes)
            table.append(f"| {name} | {cls} | {a:.3f} | {cells} |")
    errors = scope_errors(result)
    default = result[0]["default_scope"]
    closest = min(errors.values())
    pairs = [(c["guard"][0], c["ab"][0]) for m in result for c in m["classes"].values()]
    apart = statistics.fmean(abs(g / a - 1) for g, a in pairs)
    ranked = ", ".join(f"{s} {e:.1%}" for s, e in sorted(errors.items(), key=lambda kv: kv[1]))
    verdict = (
        "it measured closest"
        if errors[default] <= closest
        else f"`{min(errors, key=errors.get)}` measured closer on these runs"
    )
    met = sum(m["strict"] == "met" for m in result)
    classes_met = sum(verdict_of(m["strict"], cls) == "met" for m in result for cls in m["classes"])
    text = (
        f"Strict agreement held in {met} of {len(result)} measurements ({classes_met} of {len(pairs)} "
        f"class measurements); the guard's RC was {apart:.1%} "
        f"from the A/B's on average. Mean distance from the A/B by baseline scope: {ranked}. "
        f"The default is `{default}`: {verdict}."
    )
    return "\n".join(runs) + "\n\n" + "\n".join(table) + "\n\n" + text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--parse", nargs="+", metavar="LOG", help="printed runs to a kept result (JSON)")
    group.add_argument("--render", metavar="FILE", help="a kept result to docs/real-model.md's tables")
    args = parser.parse_args()
    if args.parse:
        lines = [line for path in args.parse for line in Path(path).read_text().splitlines()]
        result = parse(lines)
        if not result:
            sys.exit(f"{', '.join(args.parse)}: no measurement found (run the test with -s)")
        print(json.dumps(result, indent=1))
    else:
        print(render(json.loads(Path(args.render).read_text())))


if __name__ == "__main__":
    main()
