"""Seeded synthetic RequestRecords with a known true RC, for the cost-model tests.

Model: step time ``T(B, K) = c0 + cB*B + cM*B*(K+1)`` (seconds); each verify round accepts a
prefix of ``K`` drafts with i.i.d. per-token acceptance ``a`` and emits one bonus token; each
request's decode time is its rounds times ``T`` with log-normal per-request noise.
"""

from __future__ import annotations

import numpy as np

from specguard.exporters.records import RequestRecord, SpecStats

C0, CB, CM = 0.010, 0.0004, 0.0010

PROFILE_YAML = """\
format: specguard-calibration-profile
version: 1
created: "2026-11-29T13:00:00Z"
stack: {engine: vllm, engine_version: 0.32.0}
pools:
  - name: nospec
    num_speculative_tokens: 0
    levels:
      - {concurrency: 8, tpot_seconds: 0.022, samples: 100, tpot_stderr_seconds: 0.0004}
      - {concurrency: 1, tpot_seconds: 0.018, samples: 300, tpot_stderr_seconds: 0.0002, step_seconds: 0.018}
  - name: spec-k4
    num_speculative_tokens: 4
    levels:
      - concurrency: 1
        tpot_seconds: 0.0132
        samples: 200
        step_seconds: 0.053
        accept_length: 4.0
        classes:
          - {task_type: code, temperature_bucket: greedy, accept_length: 4.2, tpot_seconds: 0.0126,
             samples: 50, accepted_per_position: [0.95, 0.9, 0.8, 0.55]}
"""


def step_seconds(batch: float, k: int) -> float:
    return C0 + CB * batch + CM * batch * (k + 1)


def accept_length(a: float, k: int) -> float:
    return (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1.0


def true_rc(a: float, k: int, batch: float) -> float:
    """Per-round RC (ignores the end-of-request truncation, which the tests keep small)."""
    return step_seconds(batch, k) / (accept_length(a, k) * step_seconds(batch, 0))


def make_records(
    rng: np.random.Generator,
    n: int,
    *,
    pool: str,
    k: int,
    a: float = 0.0,
    batch: float = 2.0,
    task_type: str = "code",
    temperature_bucket: str = "greedy",
    load_bucket: str = "low",
    route: str = "plan",
    noise: float = 0.08,
    tokens: tuple[int, int] = (150, 400),
    with_stats: bool = True,
) -> list[RequestRecord]:
    out = []
    step = step_seconds(batch, k)
    for _ in range(n):
        output_tokens = int(rng.integers(tokens[0], tokens[1]))
        remaining = output_tokens - 1
        histogram = [0] * (k + 1)
        rounds = 0
        while remaining > 0:
            if k == 0:
                emitted = 1
            else:
                accepted = 0
                while accepted < k and rng.random() < a:
                    accepted += 1
                histogram[accepted] += 1
                emitted = accepted + 1
            rounds += 1
            remaining -= emitted
        decode = rounds * step * float(np.exp(rng.normal(0.0, noise)))
        spec = None
        if k > 0 and with_stats:
            accepted_total = sum(j * c for j, c in enumerate(histogram))
            spec = SpecStats(
                source="vllm",
                rounds=rounds,
                draft_tokens=rounds * k,
                accepted_tokens=accepted_total,
                accepted_histogram=tuple(histogram),
                full_rollback_rounds=histogram[0],
                output_tokens=output_tokens,
                num_speculative_tokens=k,
            )
        out.append(
            RequestRecord(
                pool=pool,
                task_type=task_type,
                temperature_bucket=temperature_bucket,
                load_bucket=load_bucket,
                route=route,
                started_at=1000.0,
                status=200,
                streamed=True,
                output_tokens=output_tokens,
                decode_seconds=decode,
                spec=spec,
            )
        )
    return out
