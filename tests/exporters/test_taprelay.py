"""Cutting SSE streams within an inspection window, in linear time and bounded memory."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from specguard.exporters.taprelay import EventSplitter
from tests.propkit import examples

EVENT = st.binary(max_size=40).map(lambda b: b"data: " + b.replace(b"\n", b"").replace(b"\r", b""))
STREAM = st.tuples(
    st.lists(st.tuples(EVENT, st.sampled_from([b"\n\n", b"\r\n\r\n"])), max_size=8), st.binary(max_size=20)
)


@settings(max_examples=examples(150), deadline=None)
@given(STREAM, st.lists(st.integers(0, 400), max_size=8), st.sampled_from([8, 30, 1 << 20]))
def test_every_byte_comes_out_once_in_order_however_it_is_cut(stream, cuts, limit):
    events, tail = stream
    data = b"".join(e + end for e, end in events) + tail.replace(b"\n", b"")
    splitter = EventSplitter(limit)
    out, prev = [], 0
    for cut in sorted(c % (len(data) + 1) for c in cuts) + [len(data)]:
        out += splitter.feed(data[prev:cut])
        prev = cut
    assert b"".join(chunk for _, chunk in out) + splitter.rest() == data
    if limit == 1 << 20:  # all within the window: exactly the events, each inspected
        assert [chunk for _, chunk in out] == [e + end for e, end in events]
        assert all(inspect for inspect, _ in out)


def test_an_endless_event_is_passed_on_in_linear_time():
    def relay(size: int) -> float:
        splitter = EventSplitter(1 << 20)
        block = b"x" * 65536
        started = time.perf_counter()
        splitter.feed(b"data: ")
        passed = sum(len(chunk) for _ in range(size // 65536) for inspect, chunk in splitter.feed(block))
        assert passed >= size - (1 << 20) - 65536
        return time.perf_counter() - started

    small, large = relay(4 << 20), relay(32 << 20)
    assert large < 16 * small  # 8x the bytes: about 8x the time (quadratic would be 64x)
