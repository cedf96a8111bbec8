"""Engine adapters: each engine's /metrics page and per-request fields into one normalised form.

``ENGINES`` maps an engine name to its module; every module has ``ENGINE``, ``PREFIX``,
``METRICS_PATH``, ``snapshot(page)``, ``request_stats(body)`` and ``missing_reason(body, request)``.
``detect(page)`` picks the engine from the metric-name prefixes on a page.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from specguard.errors import InputError
from specguard.exporters import promtext
from specguard.exporters.engines import llamacpp, sglang, tgi, trtllm, vllm
from specguard.exporters.records import SpecStats
from specguard.exporters.snapshot import EngineSnapshot

ENGINES: dict[str, ModuleType] = {m.ENGINE: m for m in (vllm, sglang, trtllm, llamacpp, tgi)}
CHOICES = ("auto", *ENGINES)


def metrics_path(engine: str) -> str:
    """Where the engine serves its Prometheus page (TRT-LLM: ``/prometheus/metrics``)."""
    return module(engine).METRICS_PATH if engine != "auto" else "/metrics"


def module(engine: str) -> ModuleType:
    try:
        return ENGINES[engine]
    except KeyError:
        raise InputError(f"unknown engine {engine!r}; expected one of {', '.join(CHOICES)}") from None


def _seen(page: promtext.Page, limit: int = 25) -> str:
    names = page.family_names()
    if not names:
        return "the page has no samples at all"
    shown = ", ".join(names[:limit])
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"families seen ({len(names)}): {shown}{more}"


def detect(page: promtext.Page) -> str:
    """The engine whose metric prefix names the most samples on the page; InputError if none."""
    counts = {name: 0 for name in ENGINES}
    for sample_name, samples in page.by_name.items():
        for name, mod in ENGINES.items():
            if sample_name.startswith(mod.PREFIX):
                counts[name] += len(samples)
    best = max(counts, key=lambda name: counts[name])
    if counts[best] == 0:
        prefixes = ", ".join(f"{m.PREFIX}*" for m in ENGINES.values())
        raise InputError(
            f"{page.source}: not a page from a known engine (no {prefixes} metrics); {_seen(page)}"
        )
    return best


def snapshot(page: promtext.Page, engine: str = "auto") -> EngineSnapshot:
    """Normalise one parsed page; ``engine="auto"`` detects it. A forced engine must match the page."""
    if engine == "auto":
        engine = detect(page)
    mod = module(engine)
    if not any(name.startswith(mod.PREFIX) for name in page.by_name):
        raise InputError(
            f"{page.source}: no {mod.PREFIX}* metrics on this page for engine {engine}; {_seen(page)}"
        )
    return mod.snapshot(page)


def parse_snapshot(text: str | bytes, source: str = "<page>", engine: str = "auto") -> EngineSnapshot:
    """Parse and normalise one exposition page in one call."""
    return snapshot(promtext.parse(text, source), engine)


def request_stats(engine: str, body: Any) -> SpecStats | None:
    """Per-request spec stats of a response body for ``engine`` (None: not reported)."""
    return module(engine).request_stats(body)


def missing_reason(engine: str, body: Any, request: dict | None = None) -> str | None:
    """Why ``request_stats`` gives None for this body (a short label for the unattributed count)."""
    return module(engine).missing_reason(body, request)
