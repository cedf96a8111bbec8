"""A finished request as the tap records it, for the stats and collector tests."""

from __future__ import annotations

from specguard.exporters.records import RequestRecord, SpecStats


def record(at, *, hist=(1, 1, 2), pool="spec-k2", task="code", out=10, decode=0.9, reason=None):
    """A request started at ``at``; ``hist`` is its accepted-drafts histogram per verify round
    (index = drafts accepted), K = len(hist) - 1; ``hist=None`` is a request without spec stats."""
    spec = None
    if hist is not None:
        rounds = sum(hist)
        spec = SpecStats(
            source="vllm",
            rounds=rounds,
            draft_tokens=rounds * (len(hist) - 1),
            accepted_tokens=sum(j * n for j, n in enumerate(hist)),
            accepted_histogram=hist,
            full_rollback_rounds=hist[0],
            output_tokens=out,
        )
    return RequestRecord(
        pool=pool,
        task_type=task,
        temperature_bucket="greedy",
        load_bucket="low",
        route="plan",
        started_at=at,
        status=200,
        streamed=True,
        output_tokens=out,
        decode_seconds=decode,
        spec=spec,
        unattributed_reason=reason,
    )
