"""The in-flight integral: a request's mean load while it decodes."""

from __future__ import annotations

import pytest

from specguard.exporters.loadmeter import LoadMeter


def test_area_integrates_in_flight_requests_over_time():
    meter = LoadMeter(["a", "b"])
    assert meter.area("a", 5.0) == 0.0  # nothing happened yet
    meter.change("a", 1, 10.0)
    meter.change("a", 1, 12.0)  # 1 request for 2 s
    first = meter.area("a", 13.0)  # + 2 requests for 1 s
    assert first == pytest.approx(4.0)
    meter.change("a", -1, 14.0)
    last = meter.area("a", 18.0)  # + 2 for 1 s, + 1 for 4 s
    assert (last - first) / (18.0 - 13.0) == pytest.approx((2 * 1 + 1 * 4) / 5)
    assert meter.in_flight == {"a": 1, "b": 0}
