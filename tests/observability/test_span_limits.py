"""Span attributes carry what a tenant's peers chose — a model response's ``id`` (up to a
message's 8 MiB), a tool call's id and arguments — and the batch processor holds up to 2,048
finished spans in a shared worker's memory before export: every string value is cut at
``telemetry.SPAN_ATTRIBUTE_MAX_CHARS`` unless the environment sets a length limit itself."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentrun import telemetry

ID = "r" * (1024 * 1024)
"""A model response's ``id`` of a mebibyte."""


def recorded(exporter: InMemorySpanExporter) -> str:
    provider = telemetry.tracer_provider(exporter, service_name="test")
    with provider.get_tracer("test").start_as_current_span("chat m") as span:
        span.set_attribute("gen_ai.response.id", ID)
    provider.force_flush()
    provider.shutdown()
    (finished,) = exporter.get_finished_spans()
    assert finished.attributes is not None
    value = finished.attributes["gen_ai.response.id"]
    assert isinstance(value, str)
    return value


def test_a_long_attribute_is_cut_at_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    assert recorded(InMemorySpanExporter()) == ID[: telemetry.SPAN_ATTRIBUTE_MAX_CHARS]


def test_the_environment_names_its_own_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "100")
    assert recorded(InMemorySpanExporter()) == ID[:100]
