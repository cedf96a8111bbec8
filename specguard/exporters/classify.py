"""Put a request into its traffic class: task type x temperature bucket (x load bucket).

Engines never label acceptance by task or temperature, so the tap does it from what the
client sent. Every label value comes from the config (unknown task types become ``other``),
which keeps the exported cardinality bounded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specguard.exporters.config import OTHER, Bucket, ClassesConfig


@dataclass(frozen=True)
class RequestClass:
    task_type: str
    temperature_bucket: str
    temperature: float  # effective temperature (the configured default when the request sets none)
    top_p: float | None
    classified: bool  # False when the body was not a JSON object


def bucket_of(value: float, buckets: tuple[Bucket, ...]) -> str:
    """Name of the first bucket whose ``max`` is >= value (the last one catches the rest)."""
    for bucket in buckets:
        if value <= bucket.max:
            return bucket.name
    return buckets[-1].name


def field_value(body: Mapping[str, Any], dotted: str) -> Any:
    """Value at a dotted path of a JSON object (``metadata.task``), or None."""
    node: Any = body
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class Classifier:
    """Classifies requests by the configured header, matchers and buckets."""

    def __init__(self, classes: ClassesConfig):
        self.classes = classes
        self._known = frozenset(classes.task_types)
        self._matchers = [
            (
                m,
                re.compile(m.model) if m.model else None,
                re.compile(m.path) if m.path else None,
                re.compile(m.match) if m.match else None,
            )
            for m in classes.matchers
        ]

    def _bounded(self, value: Any) -> str:
        if isinstance(value, str):
            value = value.strip()
            if value in self._known:
                return value
        return OTHER

    def task_type(self, headers: Mapping[str, str], path: str, body: Mapping[str, Any] | None) -> str:
        """Header first, then matchers in order; anything outside ``task_types`` is ``other``."""
        header = headers.get(self.classes.task_header)
        if header:
            return self._bounded(header)
        for matcher, model_re, path_re, match_re in self._matchers:
            if path_re is not None:
                if path_re.search(path):
                    return self._bounded(matcher.task_type)
                continue
            if body is None:
                continue
            if model_re is not None:
                model = body.get("model")
                if isinstance(model, str) and model_re.search(model):
                    return self._bounded(matcher.task_type)
                continue
            value = field_value(body, matcher.field or "")
            if value is None:
                continue
            if matcher.task_type is None:
                return self._bounded(value)
            if match_re is None or (isinstance(value, str) and match_re.search(value)):
                return self._bounded(matcher.task_type)
        return OTHER

    def temperature_bucket(self, temperature: float) -> str:
        return bucket_of(temperature, self.classes.temperature_buckets)

    def load_bucket(self, load: float) -> str:
        """Bucket of a load: in-flight requests per replica of a pool (the request itself included)."""
        return bucket_of(float(load), self.classes.load_buckets)

    def classify(self, headers: Mapping[str, str], path: str, body: Mapping[str, Any] | None) -> RequestClass:
        """Class of one request; ``body`` is None when it was not a JSON object."""
        temperature = None
        top_p = None
        if body is not None:
            temperature = _number(body.get("temperature"))
            top_p = _number(body.get("top_p"))
        if temperature is None or temperature < 0:
            temperature = self.classes.default_temperature
        return RequestClass(
            task_type=self.task_type(headers, path, body),
            temperature_bucket=self.temperature_bucket(temperature),
            temperature=temperature,
            top_p=top_p,
            classified=body is not None,
        )
