"""A finished request's record: timings are only reported where the stream makes them observable."""

from __future__ import annotations

import pytest

from specguard.exporters import tapflow
from specguard.exporters.classify import RequestClass
from specguard.exporters.config import PoolConfig

POOL = PoolConfig("spec", "http://127.0.0.1:1", "vllm", 4)


def flow(chunks: int, first: float | None, last: float | None) -> tapflow.Flow:
    cls = RequestClass(
        task_type="code", temperature_bucket="greedy", temperature=0.0, top_p=None, classified=True
    )
    f = tapflow.Flow(POOL, cls, "plan", "low", started_at=0.0, t0=10.0, body={"stream": True})
    f.status, f.streamed, f.usage_tokens = 200, True, 12
    f.chunks, f.first_at, f.last_at = chunks, first, last
    return f


@pytest.mark.parametrize(
    ("chunks", "first", "last", "decode"),
    [
        pytest.param(5, 10.2, 10.6, 0.4, id="several-chunks-timed"),
        pytest.param(2, 10.2, 10.3, 0.1, id="two-chunks-timed"),
        pytest.param(1, 10.2, 10.2, None, id="whole-answer-in-one-chunk-untimed"),
        pytest.param(0, None, None, None, id="no-content-untimed"),
    ],
)
def test_decode_time_needs_two_content_chunks(chunks, first, last, decode):
    record = tapflow.to_record(flow(chunks, first, last), "vllm", end=11.0)
    assert record.decode_seconds == (pytest.approx(decode) if decode is not None else None)
    assert (record.tpot_seconds is None) == (decode is None)
    assert record.e2e_seconds == pytest.approx(1.0)
