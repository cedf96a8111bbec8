"""The simulator's vLLM dialect against a real vLLM engine: a structural diff, so drift is caught.

The same requests go to a real engine and to a simulated pool with the same K; then their /metrics
pages (families, types, sample suffixes, label names, enumerated label values, histogram buckets)
and their JSON responses (completions, chat, stream chunks, the usage chunk,
``metrics.speculative_decoding``, error envelopes) are compared key by key. Every difference must
be listed below with the reason it is acceptable; an entry that stops being a difference fails
too, so the lists never go stale.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request

import pytest
import vllmkit as kit
from vllmkit import LOOP_PROMPT, NUM_SPECULATIVE_TOKENS

from specguard.sim import cluster
from specguard.sim import config as simconfig

pytestmark = pytest.mark.vllm

# --- allow-lists (each entry says why the difference is acceptable) ---------------------------

# Families only a real engine has. None of them is read by specguard.
REAL_ONLY_FAMILIES: dict[str, str] = {}

# Families only the simulator has (it must not invent metrics a user would then look for).
SIM_ONLY_FAMILIES: dict[str, str] = {}

# Labels whose values depend on the deployment, not on the dialect: compared by name only.
CONFIG_DEPENDENT_LABELS = {
    "model_name",  # --served-model-name
    "le",  # compared separately (token-count buckets depend on max_model_len)
    "handler",  # which HTTP routes the test happened to call
    "method",
    "status",
    "implementation",  # python_info
    "major",
    "minor",
    "patchlevel",
    "version",
}
# Info-style families whose labels are the engine's whole config: compared by presence and type.
INFO_FAMILIES = {"vllm:cache_config_info"}
# vLLM's token-count histograms use 1-2-5 buckets up to max_model_len (build_1_2_5_buckets).
TOKEN_COUNT_HISTOGRAMS = {
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:request_max_num_generation_tokens",
    "vllm:request_params_max_tokens",
    "vllm:request_prefill_kv_computed_tokens",
}
REAL_MAX_MODEL_LEN = 512  # conftest.server_command

# JSON key paths (``[]`` = any list element) only the real engine sends. specguard reads none of
# them: they are newer-version or feature fields (MoE routing, encoder cache transfer, reasoning).
REAL_ONLY_KEYS: dict[str, str] = {
    "choices[].routed_experts": "MoE expert routing (vLLM 0.32 feature), null unless requested",
    "ec_transfer_params": "encoder-cache transfer (disaggregated serving), null here",
    "usage.completion_tokens_details": "null unless reasoning tokens are counted",
    "prompt_text": "chat: null unless prompt echo is requested",
    "choices[].message.reasoning": "chat: reasoning parser output, null without a reasoning parser",
    "[].prompt_token_ids": "chat stream chunks: null unless prompt echo is requested",
    "[].prompt_text": "chat stream chunks: null unless prompt echo is requested",
    "[].choices[].token_ids": "stream chunks: null unless return_token_ids is requested",
    "[].choices[].prompt_token_ids": "completion stream chunks: as above",
}
# JSON key paths only the simulator sends.
SIM_ONLY_KEYS: dict[str, str] = {
    "choices[].message.reasoning_content": "older vLLM name of `reasoning`, null; nothing reads it",
    "choices[].message.tool_calls": "empty list; vLLM omits it here; nothing reads it",
}


# --- page structure -----------------------------------------------------------------------------


def one_two_five(limit: int) -> list[float]:
    """vLLM's ``build_1_2_5_buckets(limit)``: 1, 2, 5, 10, 20, 50, ... up to ``limit``."""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return [float(v) for v in out]
            out.append(value)
        exponent += 1


def structure(page: kit.Page) -> dict[str, dict]:
    """Per family: type, sample names (as suffixes), label names and enumerated label values."""
    out = {}
    for family, samples in page.samples.items():
        suffixes = sorted({s.name[len(family) :] for s in samples})
        labels: dict[str, set[str]] = {}
        for s in samples:
            for key, value in s.labels:
                labels.setdefault(key, set())
                if key not in CONFIG_DEPENDENT_LABELS and family not in INFO_FAMILIES:
                    labels[key].add(value)
        buckets = sorted({float(dict(s.labels)["le"]) for s in samples if s.name.endswith("_bucket")})
        out[family] = {
            "type": page.types[family],
            "suffixes": suffixes,
            "labels": {k: sorted(v) for k, v in sorted(labels.items())},
            "buckets": buckets,
        }
    return out


def diff_pages(real: kit.Page, sim: kit.Page, sim_max_model_len: int) -> list[str]:
    problems = []
    r, s = structure(real), structure(sim)
    for name in sorted(set(r) - set(s)):
        if name not in REAL_ONLY_FAMILIES:
            problems.append(f"family {name} ({r[name]['type']}) is on the real page only")
    for name in sorted(set(s) - set(r)):
        if name not in SIM_ONLY_FAMILIES:
            problems.append(
                f"family {name} ({s[name]['type']}) is on the simulator's page but not the real one"
            )
    for name in sorted(set(REAL_ONLY_FAMILIES) & set(s)):
        problems.append(f"stale allow-list: REAL_ONLY_FAMILIES[{name!r}] is now on the simulator's page")
    for name in sorted(set(SIM_ONLY_FAMILIES) & set(r)):
        problems.append(f"stale allow-list: SIM_ONLY_FAMILIES[{name!r}] is now on the real page")
    for name in sorted(set(r) & set(s)):
        a, b = r[name], s[name]
        for key in ("type", "suffixes", "labels"):
            if a[key] != b[key]:
                problems.append(f"{name}: {key} real {a[key]} != simulator {b[key]}")
        if name in TOKEN_COUNT_HISTOGRAMS:
            base = name.removeprefix("vllm:")
            if a["buckets"] != one_two_five(REAL_MAX_MODEL_LEN) + [float("inf")]:
                problems.append(
                    f"{base}: real buckets {a['buckets']} are not 1-2-5 up to {REAL_MAX_MODEL_LEN}"
                )
            if b["buckets"] != one_two_five(sim_max_model_len) + [float("inf")]:
                problems.append(
                    f"{base}: simulator buckets {b['buckets']} are not 1-2-5 up to {sim_max_model_len}"
                )
        elif a["buckets"] != b["buckets"]:
            problems.append(f"{name}: buckets real {a['buckets']} != simulator {b['buckets']}")
    return problems


# --- response structure -------------------------------------------------------------------------


def key_types(value: object, path: str = "") -> dict[str, str]:
    """Every key path of a JSON value -> its type ("null", "number", "str", "bool", "list", "dict")."""
    out: dict[str, str] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            out[sub] = _kind(item)
            out.update(key_types(item, sub))
    elif isinstance(value, list):
        for item in value:
            out.update(key_types(item, f"{path}[]"))
    return out


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def diff_shapes(what: str, real: object, sim: object) -> list[str]:
    r, s = key_types(real), key_types(sim)
    problems = []
    for path in sorted(set(r) - set(s)):
        if path not in REAL_ONLY_KEYS:
            problems.append(f"{what}: key {path} ({r[path]}) only in the real response")
    for path in sorted(set(s) - set(r)):
        if path not in SIM_ONLY_KEYS:
            problems.append(f"{what}: key {path} ({s[path]}) only in the simulator's response")
    for path in sorted(set(r) & set(s)):
        # A field that is null on one side only is a value difference (e.g. system_fingerprint),
        # not a shape difference; two non-null values must have the same kind.
        if "null" not in (r[path], s[path]) and r[path] != s[path]:
            problems.append(f"{what}: {path} is {r[path]} in the real response, {s[path]} in the simulator's")
    return problems


def http_error(url: str, path: str, body: dict) -> tuple[int, dict]:
    try:
        kit.post(url, path, body)
    except AssertionError as exc:  # vllmkit.post turns an HTTP error into "... HTTP <code>: <body>"
        head, _, detail = str(exc).partition(": ")
        return int(head.rsplit(" ", 1)[-1]), json.loads(detail)
    raise AssertionError(f"{path} {body} was accepted; expected an HTTP error")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def exchange(url: str, model: str) -> dict[str, object]:
    """The same conversation with one engine; returns what it answered, by name."""
    cmpl = {"model": model, "prompt": LOOP_PROMPT, "max_tokens": 24, "temperature": 0}
    chat = {"model": model, "messages": [{"role": "user", "content": LOOP_PROMPT}], "max_tokens": 24}
    usage = {"stream_options": {"include_usage": True}}
    out: dict[str, object] = {
        "completion": kit.post(url, "/v1/completions", cmpl),
        "chat completion": kit.post(url, "/v1/chat/completions", {**chat, "temperature": 0}),
        "completion n=2": kit.post(url, "/v1/completions", {**cmpl, "n": 2, "temperature": 0.8, "seed": 1}),
        "models": get_json(f"{url}/v1/models"),
        "error": http_error(url, "/v1/completions", {**cmpl, "max_tokens": -1}),
    }
    for name, path, body in (
        ("completion stream", "/v1/completions", cmpl),
        ("chat stream", "/v1/chat/completions", {**chat, "temperature": 0.5}),
    ):
        events = kit.stream(url, path, {**body, **usage})
        out[f"{name}: content chunks"] = [e for e in events if e.get("choices")]
        out[f"{name}: usage chunk"] = events[-1]
        out[f"{name} without usage"] = kit.stream(url, path, body)
    out["version"] = get_json(f"{url}/version")["version"]
    return out


async def sim_exchange(pools: list[str]) -> tuple[dict[str, dict], dict[str, kit.Page], int]:
    # The real engines run with vLLM's default --fingerprint-mode full.
    full = simconfig.load().with_overrides(fingerprint_mode="full")
    async with cluster.SimCluster.from_config(
        full, seed=0, dialect="vllm", time_scale=0.01, pools=pools
    ) as sim:
        model = sim.config.model_name
        answers, pages = {}, {}
        for pool in pools:
            answers[pool] = await asyncio.to_thread(exchange, sim.urls[pool], model)
            pages[pool] = await asyncio.to_thread(kit.scrape, sim.urls[pool])
        return answers, pages, sim.config.max_model_len


@pytest.fixture(scope="module")
def both(vllm_engines):
    """(real answers, real pages, sim answers, sim pages, sim max_model_len), keyed spec/nospec."""
    sim_pools = {"spec": "spec-k4", "nospec": "nospec"}
    sim_answers, sim_pages, sim_max_len = asyncio.run(sim_exchange(list(sim_pools.values())))
    real_answers, real_pages = {}, {}
    for which in sim_pools:
        engine = getattr(vllm_engines, which)
        real_answers[which] = exchange(engine.url, vllm_engines.model)
        real_pages[which] = kit.scrape(engine.url)
    sim_answers = {which: sim_answers[pool] for which, pool in sim_pools.items()}
    sim_pages = {which: sim_pages[pool] for which, pool in sim_pools.items()}
    return real_answers, real_pages, sim_answers, sim_pages, sim_max_len


def test_simulated_k4_pool_has_the_real_engines_spec_decode_families(both):
    real_answers, real_pages, sim_answers, sim_pages, _ = both
    for pages in (real_pages, sim_pages):
        spec = sorted(f for f in pages["spec"].types if f.startswith("vllm:spec_decode"))
        assert spec, "no vllm:spec_decode_* family on a K=4 page"
        assert not [f for f in pages["nospec"].types if f.startswith("vllm:spec_decode")]
        positions = {dict(s.labels)["position"] for s in pages["spec"].samples[kit.PER_POS]}
        assert positions == {str(i) for i in range(NUM_SPECULATIVE_TOKENS)}


@pytest.mark.parametrize("which", ["spec", "nospec"])
def test_metrics_page_structure_matches_the_real_engine(both, which):
    _, real_pages, _, sim_pages, sim_max_len = both
    problems = diff_pages(real_pages[which], sim_pages[which], sim_max_len)
    assert not problems, "simulator /metrics drifted from vLLM:\n" + "\n".join(problems)


@pytest.mark.parametrize("which", ["spec", "nospec"])
def test_response_shapes_match_the_real_engine(both, which):
    real_answers, _, sim_answers, _, _ = both
    problems = []
    for name, real in real_answers[which].items():
        problems += diff_shapes(f"{which} {name}", real, sim_answers[which][name])
    assert not problems, "simulator responses drifted from vLLM:\n" + "\n".join(problems)


def test_key_allow_lists_are_not_stale(both):
    real_answers, _, sim_answers, _, _ = both
    used = set()
    for which, answers in real_answers.items():
        for name, real in answers.items():
            r, s = key_types(real), key_types(sim_answers[which][name])
            used |= {p for p in REAL_ONLY_KEYS if p in r and p not in s}
            used |= {p for p in SIM_ONLY_KEYS if p in s and p not in r}
    stale = sorted((set(REAL_ONLY_KEYS) | set(SIM_ONLY_KEYS)) - used)
    assert not stale, f"allow-list entries that are no longer a difference (delete them): {stale}"


def test_per_request_semantics_match(both):
    """Where the spec summary appears (and where it is null) is the same on both sides."""
    real_answers, _, sim_answers, _, _ = both
    for answers in (real_answers, sim_answers):
        spec, nospec = answers["spec"], answers["nospec"]
        assert kit.spec_metrics(spec["completion"]) is not None
        assert kit.spec_metrics(spec["chat completion"]) is not None
        assert spec["completion n=2"]["metrics"] is None  # n > 1: nothing per request
        for name in ("completion stream", "chat stream"):
            assert spec[f"{name}: usage chunk"]["choices"] == []
            assert kit.spec_metrics(spec[f"{name}: usage chunk"]) is not None
            assert all(kit.spec_metrics(c) is None for c in spec[f"{name}: content chunks"])
            assert kit.spec_metrics(nospec[f"{name}: usage chunk"]) is None
        assert kit.spec_metrics(nospec["completion"]) is None
        status, _ = spec["error"]
        assert status == 400


def test_error_envelope_matches(both):
    real_answers, _, sim_answers, _, _ = both
    real_status, real_body = real_answers["spec"]["error"]
    sim_status, sim_body = sim_answers["spec"]["error"]
    assert (sim_status, sorted(sim_body)) == (real_status, sorted(real_body))
    assert sorted(sim_body["error"]) == sorted(real_body["error"])


def fingerprinted(events: list[dict]) -> list[int]:
    return [i for i, e in enumerate(events) if "system_fingerprint" in e]


def terminal(events: list[dict]) -> list[int]:
    return [i for i, e in enumerate(events) if any(c.get("finish_reason") for c in e.get("choices", []))]


def test_system_fingerprint_is_where_the_real_engine_puts_it(both):
    """``vllm-<version>-<hash8>`` on full responses; in a stream on the usage chunk when the client
    asked for usage, else on each choice's terminal chunk (the one with ``finish_reason``)."""
    real_answers, _, sim_answers, _, _ = both
    for side, answers in (("real", real_answers), ("simulator", sim_answers)):
        per_engine = {}
        for which, got in answers.items():
            where = f"{side} {which}"
            prints = {
                got[name]["system_fingerprint"]
                for name in ("completion", "chat completion", "completion n=2")
            }
            assert len(prints) == 1, f"{where}: one engine, several fingerprints {prints}"
            fingerprint = per_engine[which] = prints.pop()
            assert re.fullmatch(rf"vllm-{re.escape(got['version'])}-[0-9a-f]{{8}}", fingerprint), where
            for name in ("completion stream", "chat stream"):
                plain = got[f"{name} without usage"]
                assert fingerprinted(plain) == terminal(plain) != [], f"{where} {name}: {plain}"
                assert {plain[i]["system_fingerprint"] for i in terminal(plain)} == {fingerprint}
                # It is the chunk's last key (pydantic field order; unset fields are left out).
                assert all(list(plain[i])[-1] == "system_fingerprint" for i in terminal(plain)), where
                assert fingerprinted(got[f"{name}: content chunks"]) == [], where
                keys = list(got[f"{name}: usage chunk"])
                assert got[f"{name}: usage chunk"]["system_fingerprint"] == fingerprint, where
                assert keys[keys.index("system_fingerprint") - 1] == "usage", f"{where} {name}: {keys}"
        # The hash covers the engine's config, so engines with and without speculation differ.
        assert per_engine["spec"] != per_engine["nospec"], f"{side}: {per_engine}"
