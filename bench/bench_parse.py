"""Parse + derive time of the real 55 KB vLLM page, as a ratio to prometheus_client's parser.

Both run in the same process on the same page, interleaved, ``--repeat`` rounds of ``--number``
calls each; the figure is the ratio of the medians (lower is better; < 1 means faster than
``prometheus_client.parser.text_string_to_metric_families``, which only parses).

    python3 bench/bench_parse.py [--page PATH] [--repeat 15] [--number 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from specguard.exporters import derive, engines, promtext

PAGE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-0.32-cpu-ngram-k4.metrics.txt"


def baseline(text: str) -> int:
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def parse_only(text: str) -> int:
    return len(promtext.parse(text).by_name)


def parse_and_derive(text: str) -> float | None:
    return derive.derive(engines.snapshot(promtext.parse(text))).accept_length


def measure(func, text: str, number: int) -> float:
    started = time.perf_counter()
    for _ in range(number):
        func(text)
    return (time.perf_counter() - started) / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=20)
    args = parser.parse_args()
    text = args.page.read_text()
    cases = {
        "prometheus_client parse (baseline)": baseline,
        "specguard parse": parse_only,
        "specguard parse + snapshot + derive": parse_and_derive,
    }
    for func in cases.values():  # warm up
        func(text)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeat):
        for name, func in cases.items():
            times[name].append(measure(func, text, args.number))
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians["prometheus_client parse (baseline)"]
    print(f"page: {args.page.name} ({len(text.encode()) / 1024:.1f} KiB, {text.count(chr(10))} lines)")
    print(f"{'case':<40} {'median ms':>10} {'ratio':>7}")
    for name, value in medians.items():
        print(f"{name:<40} {value * 1000:>10.3f} {value / base:>7.3f}")
    print(
        json.dumps(
            {
                "bench": "parse",
                "page_bytes": len(text.encode()),
                "repeat": args.repeat,
                "number": args.number,
                "baseline_ms": round(base * 1000, 4),
                "parse_ms": round(medians["specguard parse"] * 1000, 4),
                "parse_derive_ms": round(medians["specguard parse + snapshot + derive"] * 1000, 4),
                "parse_ratio": round(medians["specguard parse"] / base, 4),
                "parse_derive_ratio": round(medians["specguard parse + snapshot + derive"] / base, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
