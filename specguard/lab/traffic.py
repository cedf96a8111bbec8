"""``specguard load``'s work: the demo's mixed traffic sent to a tap (or any OpenAI-compatible URL).

The mix is the scenarios' four classes (code and extraction greedy, chat at 0.7, creative at
1.0, equal shares), sent by ``loadgen.run_load`` with closed-loop clients, so a hand-run tap sees
every class often enough for the guard's ``min_samples`` and a live no-spec baseline. Each class
asks for its own task (``lab.prompts``: invoice fields to copy, code to rewrite, a question, a
poem), so a real model's acceptance and lengths differ by class as a user's traffic would. The
model is the one the URL serves (``/v1/models``) unless one is given.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from specguard import columns, signals
from specguard.errors import ConfigError, ConfigIssue, UnreachableError
from specguard.lab import loadgen, scenario
from specguard.sim.config import MODEL_NAME

DEFAULT_URL = "http://127.0.0.1:8090"  # tap.listen of the shipped default config
SIM_MODEL = MODEL_NAME  # what `specguard simulate` serves


def mix_of(loads: Iterable[scenario.ClassLoad], max_tokens: int | None = None) -> list[loadgen.RequestClass]:
    """A scenario phase's class loads as a request mix: each (task, temperature) weighted by its clients."""
    mix = []
    for load in loads:
        total = sum(w for _, w in load.temperatures)
        mix += [
            loadgen.RequestClass(
                load.task_type, load.clients * w / total, temperature=t, max_tokens=max_tokens, prompts="task"
            )
            for t, w in load.temperatures
        ]
    return mix


def default_mix(max_tokens: int | None = None) -> list[loadgen.RequestClass]:
    """The default scenario's first phase: the four task types in equal shares."""
    return mix_of(scenario.default_scenario().phases[0].loads, max_tokens)


@dataclass(frozen=True)
class ClassSummary:
    task_type: str
    temperature: float | None
    requests: int
    ok: int
    tpot_mean_ms: float | None  # streams with at least two tokens; wall clock


@dataclass(frozen=True)
class LoadSummary:
    url: str
    model: str | None
    clients: int
    seconds: float
    sent: int
    ok: int
    failed: int
    first_error: str | None
    classes: tuple[ClassSummary, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        lines = [
            f"{self.sent} requests to {self.url} in {self.seconds:.0f} s ({self.clients} clients): "
            f"{self.ok} ok, {self.failed} failed"
        ]
        if self.first_error:
            lines.append(f"first error: {self.first_error}")
        rows = [("TASK", "TEMP", "REQUESTS", "OK", "MEAN TPOT")]
        for c in self.classes:
            temp = "-" if c.temperature is None else f"{c.temperature:g}"
            tpot = "-" if c.tpot_mean_ms is None else f"{c.tpot_mean_ms:.1f} ms"
            rows.append((c.task_type, temp, str(c.requests), str(c.ok), tpot))
        lines += columns.aligned(rows)
        return "\n".join(lines)


def summarize(
    results: Sequence[loadgen.LoadResult], url: str, model: str | None, clients: int, seconds: float
) -> LoadSummary:
    keys: dict[tuple[str, float | None], list[loadgen.LoadResult]] = {}
    for r in results:
        keys.setdefault((r.task_type, r.temperature), []).append(r)
    classes = []
    for (task, temperature), group in sorted(keys.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0.0)):
        ok = [r for r in group if r.ok]
        tpots = [r.tpot_seconds for r in ok if r.tpot_seconds is not None]
        mean = sum(tpots) / len(tpots) * 1000 if tpots else None
        classes.append(ClassSummary(task, temperature, len(group), len(ok), mean))
    failed = [r for r in results if not r.ok]
    first = min(failed, key=lambda r: r.index, default=None)
    return LoadSummary(
        url=url,
        model=model,
        clients=clients,
        seconds=seconds,
        sent=len(results),
        ok=len(results) - len(failed),
        failed=len(failed),
        first_error=None if first is None else first.error or f"HTTP {first.status}",
        classes=tuple(classes),
    )


def flag_error(message: str) -> ConfigError:
    """A flag mistake: printed as ``Error: specguard load: <message>``, exit status 2."""
    return ConfigError(ConfigIssue("specguard load", None, None, "", message))


def check_url(url: str) -> str:
    """``url`` without a trailing slash, or a ConfigError saying why it is no base URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise flag_error(f"--url {url!r}: give a base URL such as {DEFAULT_URL}")
    return url.rstrip("/")


async def served_model(url: str, timeout_s: float = 10.0) -> str | None:
    """The first model ``url`` lists at ``/v1/models`` (None when it answers with no list); nothing
    answering is an UnreachableError."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(url + "/v1/models") as response,
        ):
            body = await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise UnreachableError(f"cannot reach {url}: {exc or type(exc).__name__}") from exc
    try:
        models = json.loads(body).get("data")
        first = models[0].get("id") if isinstance(models, list) and models else None
    except (ValueError, AttributeError):
        return None
    return first if isinstance(first, str) and first else None


async def send(
    url: str,
    *,
    clients: int = 32,
    duration_s: float | None = 60.0,
    requests: int | None = None,
    model: str | None = None,
    seed: int = 0,
    stream: bool = True,
    max_tokens: int | None = 256,
    stop: asyncio.Event | None = None,
) -> LoadSummary:
    """Check ``url`` answers, then run the default mix against it; Ctrl-C ends it early (summarised).

    ``model`` None: the one ``url`` serves (its ``/v1/models``); a URL that lists none is a flag
    error asking for ``--model``."""
    url = check_url(url)
    if clients < 1:
        raise flag_error(f"--clients ({clients}) must be >= 1")
    if duration_s is not None and duration_s <= 0:
        raise flag_error(f"--duration ({duration_s:g}) must be > 0")
    if requests is not None and requests < 1:
        raise flag_error(f"--requests ({requests}) must be >= 1")
    served = await served_model(url)
    if model is None:
        if served is None:
            raise flag_error(f"{url}/v1/models lists no model: give one with --model")
        model = served
    stop = stop or asyncio.Event()
    started = time.monotonic()
    with signals.stop_on(stop, (signal.SIGINT,)):
        results = await loadgen.run_load(
            url,
            default_mix(max_tokens),
            clients,
            duration_s,
            requests,
            stream=stream,
            seed=seed,
            model=model,
            stop=stop,
        )
    return summarize(results, url, model, clients, time.monotonic() - started)
