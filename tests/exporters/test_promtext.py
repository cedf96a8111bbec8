"""The exposition-page parser: the real vLLM pages, the format's corners, and malformed input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.parser import text_string_to_metric_families

from specguard.errors import InputError
from specguard.exporters import derive, engines, promtext
from tests.propkit import examples

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
K4 = (FIXTURES / "vllm-0.32-cpu-ngram-k4.metrics.txt").read_text()
NOSPEC = (FIXTURES / "vllm-0.32-cpu-nospec.metrics.txt").read_text()


def _key(value: float) -> object:
    return "nan" if math.isnan(value) else value


@pytest.mark.parametrize("text", [K4, NOSPEC], ids=["k4", "nospec"])
def test_real_pages_give_the_same_samples_as_prometheus_client(text):
    ours = {
        (s.name, s.labels, _key(s.value))
        for family in promtext.parse(text).families.values()
        for s in family.samples
    }
    theirs = {
        (s.name, tuple(sorted(s.labels.items())), _key(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert ours == theirs
    assert len(ours) > 400


def test_real_page_families_types_and_lookup():
    page = promtext.parse(K4, "k4.txt")
    assert page.families["vllm:spec_decode_num_drafts_total"].type == "counter"
    assert page.families["vllm:inter_token_latency_seconds"].type == "histogram"
    assert page.families["http_request_size_bytes"].type == "summary"
    (drafts,) = page.samples("vllm:spec_decode_num_drafts_total")
    assert drafts.value == 192.0
    assert drafts.label("model_name") == "tinyllm" and drafts.label("engine") == "0"
    assert drafts.line == 39
    positions = [
        s.label("position") for s in page.samples("vllm:spec_decode_num_accepted_tokens_per_pos_total")
    ]
    assert positions == ["0", "1", "2", "3"]
    itl = page.families["vllm:inter_token_latency_seconds"]
    assert {s.name for s in itl.samples} == {
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:inter_token_latency_seconds_sum",
    }
    assert "vllm:spec_decode_num_drafts_total" in page.family_names()
    assert "vllm:spec_decode_num_drafts_total" not in promtext.parse(NOSPEC).family_names()


def test_escapes_special_values_timestamps_and_label_order():
    page = promtext.parse(
        "# HELP m A help with \\\\ and \\n.\n"
        "# TYPE m gauge\n"
        'm{b="2",a="x\\"y\\\\z\\nw"} NaN\n'
        'm{a="p", b="q",} +Inf 1700000000000\n'
        'm{ b = "1" , a = "}{" } -Inf\n'
        "m 1.5e-3\n"
    )
    family = page.families["m"]
    assert family.help == "A help with \\ and \n."
    first, second, third, fourth = family.samples
    assert first.labels == (("a", 'x"y\\z\nw'), ("b", "2")) and math.isnan(first.value)
    assert second.value == math.inf and second.timestamp == 1700000000000
    assert third.labels == (("a", "}{"), ("b", "1")) and third.value == -math.inf
    assert fourth.labels == () and fourth.value == 0.0015 and fourth.timestamp is None


def test_untyped_samples_created_series_and_openmetrics_eof():
    page = promtext.parse(
        "lonely_metric 3\n"
        "# TYPE requests counter\n"
        "requests_total 7\n"
        "requests_created 1.7e9\n"
        "# TYPE lat histogram\n"
        'lat_bucket{le="+Inf"} 2\nlat_count 2\nlat_sum 0.5 # {trace_id="abc"} 0.3 1.0\n'
        "# EOF\n"
    )
    assert page.families["lonely_metric"].type == "untyped"
    assert [s.name for s in page.families["requests"].samples] == ["requests_total", "requests_created"]
    assert page.samples("lat_sum")[0].value == 0.5
    with pytest.raises(InputError, match=r"<page>:3: .*nothing after '# EOF'"):
        promtext.parse("a 1\n# EOF\nb 2\n")


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text-0.0.4", "openmetrics"])
def test_pages_rendered_by_prometheus_client_round_trip(openmetrics):
    registry = CollectorRegistry()
    counter = Counter("spec_rounds", "Rounds.", ["model_name", "engine"], registry=registry)
    counter.labels('we"ird\\name\nx', "0").inc(3)
    histogram = Histogram("step_seconds", "Step.", ["engine"], buckets=(0.01, 0.1), registry=registry)
    histogram.labels("1").observe(0.05)
    Gauge("running", "Running.", unit="requests", registry=registry).set(float("nan"))
    render = openmetrics_latest if openmetrics else generate_latest
    page = promtext.parse(render(registry))
    (rounds,) = page.samples("spec_rounds_total")
    assert rounds.value == 3 and rounds.label("model_name") == 'we"ird\\name\nx'
    assert page.samples("spec_rounds_created")[0].value > 1e9
    assert page.samples("step_seconds_count")[0].value == 1
    assert [s.label("le") for s in page.samples("step_seconds_bucket")] == ["0.01", "0.1", "+Inf"]
    assert math.isnan(page.samples("running_requests")[0].value)
    assert page.families["step_seconds"].type == "histogram"


def test_crlf_blank_lines_comments_and_bytes():
    page = promtext.parse(b'# just a comment\r\n\r\nfoo 1\r\n   \n#\nbar{x="1"} 2\n')
    assert page.samples("foo")[0].value == 1 and page.samples("bar")[0].value == 2
    assert promtext.parse("").family_names() == []


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ('ok 1\nfoo{a="b" 1\n', 2, "',' or '}' after a label value"),
        ("foo{a=b} 1\n", 1, 'a label name="value" pair'),
        ('foo{a="b",a="c"} 1\n', 1, "each label name at most once"),
        ("foo\n", 1, "a space and a sample value"),
        ("foo one\n", 1, "a sample value"),
        ("foo 1_000\n", 1, "a sample value"),
        ("foo 1 2 3\n", 1, "a sample value and at most one timestamp"),
        ("foo 1 later\n", 1, "a timestamp"),
        ("a 1\n\n9foo 1\n", 3, "a metric name"),
        ("# TYPE foo countr\n", 1, "a metric type"),
        ("# TYPE\n", 1, "a metric name after '# TYPE'"),
        ("# HELP 1x help\n", 1, "a metric name after '# HELP'"),
        ("# TYPE foo gauge\nfoo 1\n# TYPE foo counter\n", 3, "one TYPE for foo"),
        ('foo{a="b"}1\n', 1, "a space and a sample value"),
    ],
)
def test_malformed_pages_name_the_line_and_the_expectation(text, line, expected):
    with pytest.raises(InputError) as caught:
        promtext.parse(text, "page.txt")
    message = str(caught.value)
    assert message.startswith(f"page.txt:{line}")
    assert f"expected {expected}" in message


def test_non_utf8_bytes_are_an_input_error():
    with pytest.raises(InputError, match="not UTF-8"):
        promtext.parse(b"foo 1\n\xff\xfe 2\n", "x")


# pages to mutate: the spec-decode part of the real vLLM page and the reconstructed pages
SOURCES = [
    "\n".join(K4.splitlines()[30:90]) + "\n",
    *(
        (FIXTURES / name).read_text()
        for name in (
            "sglang-0.5.23-reconstructed.metrics.txt",
            "trtllm-reconstructed.metrics.txt",
            "tgi-reconstructed.metrics.txt",
            "vllm-dp2-two-models-multiproc.metrics.txt",
        )
    ),
]
_EDITS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=10**6),
        st.sampled_from(["delete", "insert", "replace"]),
        st.sampled_from(list('{}",=\\ \n#0.eE+-_aZ:\t\r') + ["NaN", "+Inf", "-1", "# EOF\n", "# TYPE x y\n"]),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SOURCES), _EDITS)
def test_mutated_pages_parse_or_raise_input_error_only(text, edits):
    for position, action, piece in edits:
        position = position % (len(text) + 1)
        if action == "delete":
            text = text[:position] + text[position + 1 :]
        elif action == "insert":
            text = text[:position] + piece + text[position:]
        else:
            text = text[:position] + piece + text[position + 1 :]
    try:
        page = promtext.parse(text)
    except InputError as exc:
        assert str(exc).startswith("<page>:")
        return
    assert all(isinstance(s.value, float) for fam in page.families.values() for s in fam.samples)
    # the adapters and the derivation on top must not crash either: an InputError or a result
    try:
        result = derive.derive(engines.snapshot(page))
    except InputError:
        return
    assert tuple(result.as_dict()) == derive.KEYS
