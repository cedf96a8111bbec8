"""Classification: header, matchers, bounded labels, temperature and load buckets."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from specguard.exporters.classify import Classifier, bucket_of
from specguard.exporters.config import ClassesConfig, Matcher
from specguard.monitor import config

MATCHERS = (
    Matcher(task_type="code", model="^codellama"),
    Matcher(task_type="extraction", path="^/v1/completions$"),
    Matcher(task_type="chat", field="metadata.app", match="^assist"),
    Matcher(field="metadata.task"),
)


@pytest.fixture
def classifier():
    return Classifier(ClassesConfig(task_types=("code", "extraction", "chat", "creative"), matchers=MATCHERS))


@pytest.mark.parametrize(
    "headers, path, body, expected",
    [
        pytest.param({"X-Task-Type": "code"}, "/v1/chat/completions", {}, "code", id="header-any-case"),
        pytest.param({"x-task-type": "poetry"}, "/v1/chat/completions", {}, "other", id="header-unknown"),
        pytest.param(
            {"x-task-type": "chat"}, "/v1/completions", {"model": "codellama"}, "chat", id="header-first"
        ),
        pytest.param({}, "/v1/chat/completions", {"model": "codellama-7b"}, "code", id="model"),
        pytest.param({}, "/v1/completions", {"model": "llama"}, "extraction", id="path"),
        pytest.param(
            {}, "/v1/chat/completions", {"metadata": {"app": "assistant"}}, "chat", id="field-match"
        ),
        pytest.param(
            {}, "/v1/chat/completions", {"metadata": {"task": "creative"}}, "creative", id="field-value"
        ),
        pytest.param(
            {}, "/v1/chat/completions", {"metadata": {"task": "x" * 500}}, "other", id="field-unbounded"
        ),
        pytest.param({}, "/v1/chat/completions", {"metadata": {"task": 3}}, "other", id="field-not-string"),
        pytest.param({}, "/v1/chat/completions", {}, "other", id="nothing"),
        pytest.param({}, "/v1/chat/completions", None, "other", id="not-json"),
    ],
)
def test_task_type(classifier, headers, path, body, expected):
    assert classifier.task_type(CIMultiDict(headers), path, body) == expected


@pytest.mark.parametrize(
    "body, bucket, temperature",
    [
        ({"temperature": 0}, "greedy", 0.0),
        ({"temperature": 0.3}, "low", 0.3),
        ({"temperature": 0.5}, "low", 0.5),
        ({"temperature": 0.7}, "medium", 0.7),
        ({"temperature": 1.5}, "high", 1.5),
        ({}, "high", 1.0),  # the engine default
        ({"temperature": "hot"}, "high", 1.0),
        ({"temperature": None}, "high", 1.0),
    ],
)
def test_temperature_bucket_and_default(classifier, body, bucket, temperature):
    cls = classifier.classify({}, "/v1/completions", body)
    assert (cls.temperature_bucket, cls.temperature) == (bucket, temperature)
    assert cls.classified


def test_top_p_recorded_and_unclassified_body():
    classifier = Classifier(config.load_default().exporter.classes)
    assert classifier.classify({}, "/v1/completions", {"top_p": 0.9}).top_p == 0.9
    cls = classifier.classify({"x-task-type": "code"}, "/v1/completions", None)
    assert not cls.classified and cls.task_type == "code"


def test_load_buckets_follow_config():
    classifier = Classifier(config.load_default().exporter.classes)
    assert [classifier.load_bucket(n) for n in (1, 16, 17, 48, 49, 500)] == [
        "low",
        "low",
        "medium",
        "medium",
        "high",
        "high",
    ]
    assert bucket_of(1e9, classifier.classes.load_buckets) == "high"
