"""Engine pages with NaN or infinite samples: refused one by one, never summed into a counter.

One NaN then one +Inf in an engine counter left ``specguard_engine_*_total`` at +Inf (or NaN)
for good: every later increase was added to it. Each such sample is dropped and counted; the
rest of the page is used, and the counters go on from the last finite value.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry

from specguard.monitor.app import Monitor
from tests.reliability import hostkit, relkit

ACCEPTED = 'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tinyllm"} '


def page(accepted: str) -> bytes:
    """The fixture page with its accepted-tokens counter at ``accepted``."""
    text = hostkit.vllm_page().decode()
    assert ACCEPTED + "528.0" in text
    return text.replace(ACCEPTED + "528.0", ACCEPTED + accepted).encode()


async def test_a_nan_then_an_inf_sample_leave_the_engine_counters_finite():
    engine = hostkit.Engine()
    registry = CollectorRegistry()
    async with relkit.serving(engine.app()) as engine_url:
        monitor = Monitor(relkit.monitor_config({"spec-k4": engine_url}), registry=registry)
        await monitor.start("127.0.0.1", 0)
        loop = monitor.loops[0]
        value = registry.get_sample_value
        labels = {"pool": "spec-k4"}
        try:
            seen = []
            for accepted in ("528.0", "NaN", "+Inf", "600.0", "650.0"):
                engine.page = page(accepted)
                assert await loop.scrape_once(), accepted  # the rest of the page is still used
                seen.append(value("specguard_engine_accepted_tokens_total", labels))
        finally:
            await monitor.stop()
    assert all(math.isfinite(v) for v in seen), seen
    assert seen == [0.0, 0.0, 0.0, 72.0, 122.0]  # the increases since the first page, nothing else
    assert value("specguard_scrape_non_finite_samples_total", labels) == 2.0
    assert value("specguard_engine_up", labels) == 1.0
    assert value("specguard_engine_draft_tokens_total", labels) == 0.0  # the page's other counters
