"""Small, specguard-independent helpers for talking to a real vLLM engine in tests.

The oracle for every cross-check is computed here from raw data (prometheus_client's own parser,
raw JSON and SSE), never through specguard's adapters, so a bug there cannot hide itself.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

MODEL_NAME = "tinyllm"
SMOL_NAME = "smollm2"  # SmolLM2-135M-Instruct, the real trained model (scripts/provision-vllm)
NUM_SPECULATIVE_TOKENS = 4
SPEC_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}
# A prompt the random model loops on, so n-gram drafts get accepted.
LOOP_PROMPT = (
    "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. "
    "the quick brown fox"
)

SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION = "vllm:generation_tokens"
SUCCESS = "vllm:request_success"


def fetch(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass
class Page:
    """One /metrics page as raw samples, keyed by family (prometheus_client's view of it)."""

    text: str
    types: dict[str, str] = field(default_factory=dict)  # family -> type
    samples: dict[str, list[Sample]] = field(default_factory=dict)  # family -> samples

    @classmethod
    def parse(cls, text: str) -> Page:
        page = cls(text)
        for fam in text_string_to_metric_families(text):
            page.types[fam.name] = fam.type
            page.samples[fam.name] = [
                Sample(s.name, tuple(sorted(s.labels.items())), s.value) for s in fam.samples
            ]
        return page

    def total(self, family: str, sample_name: str | None = None, **labels: str) -> float | None:
        """Sum of a family's samples named ``sample_name`` (default: counters' ``_total``)."""
        if family not in self.samples:
            return None
        want = sample_name or (family + "_total" if self.types[family] == "counter" else family)
        return sum(
            s.value
            for s in self.samples[family]
            if s.name == want and all(dict(s.labels).get(k) == v for k, v in labels.items())
        )

    def per_position(self) -> list[float] | None:
        if PER_POS not in self.samples:
            return None
        by_pos: dict[int, float] = {}
        for s in self.samples[PER_POS]:
            if s.name == PER_POS + "_total":
                pos = int(dict(s.labels)["position"])
                by_pos[pos] = by_pos.get(pos, 0.0) + s.value
        return [by_pos[i] for i in sorted(by_pos)]

    def spec_counters(self) -> dict[str, float]:
        out = {key: self.total(fam) or 0.0 for key, fam in SPEC_COUNTERS.items()}
        out["generation_tokens"] = self.total(GENERATION) or 0.0
        out["requests"] = self.total(SUCCESS) or 0.0
        for i, v in enumerate(self.per_position() or []):
            out[f"per_pos_{i}"] = v
        return out


def scrape(base_url: str) -> Page:
    return Page.parse(fetch(f"{base_url}/metrics"))


def delta(before: Page, after: Page) -> dict[str, float]:
    b, a = before.spec_counters(), after.spec_counters()
    return {k: a[k] - b.get(k, 0.0) for k in a}


def post(base_url: str, path: str, body: dict, headers: dict | None = None, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(
        f"{base_url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise AssertionError(f"POST {path} -> HTTP {exc.code}: {detail}") from None


def stream(base_url: str, path: str, body: dict, headers: dict | None = None, timeout: float = 120.0) -> list:
    """POST with ``stream: true``; return the decoded JSON of every SSE ``data:`` event (not [DONE])."""
    req = urllib.request.Request(
        f"{base_url}{path}",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            events.append(json.loads(data))
    return events


def spec_metrics(response: dict) -> dict | None:
    """``metrics.speculative_decoding`` of a response or usage chunk, None when absent or null."""
    metrics = response.get("metrics")
    if not isinstance(metrics, dict):
        return None
    return metrics.get("speculative_decoding")


def expected_deltas(stats: Iterable[dict], k: int) -> dict[str, float]:
    """Engine counter deltas that a set of per-request spec summaries implies."""
    out = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    out.update({f"per_pos_{i}": 0.0 for i in range(k)})
    for s in stats:
        out["drafts"] += s["num_spec_steps"]
        out["draft_tokens"] += s["num_draft_tokens"]
        out["accepted_tokens"] += s["num_accepted_draft_tokens"]
        hist = s["acceptance_histogram"]
        for i in range(k):
            out[f"per_pos_{i}"] += sum(hist[i + 1 :])
    return out


def stop_string_in(text: str, size: int = 5) -> str:
    """A piece of a greedy output, from its second half, that a rerun will stop on.

    Prefers plain ASCII: the tiny model also emits lone byte tokens that detokenize to U+FFFD,
    and a stop string made of those may never match the incremental text.
    """
    start = len(text) // 2
    for i in range(start, len(text) - size + 1):
        piece = text[i : i + size]
        if piece.isascii() and piece.isprintable() and piece.strip():
            return piece
    return text[start:][:size]
