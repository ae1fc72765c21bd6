"""OpenTelemetry traces for runs, model calls and tool calls (GenAI semantic conventions).

One run is one trace, across processes. At admission the operator mints the run span's ids and
stores them (as a W3C ``traceparent``) in the run's admitted event; every TurnRequest carries
that ``traceparent`` in its NATS headers; workers open ``chat {model}`` and
``execute_tool {name}`` spans as its children; when the run ends, whichever operator process
sees the end emits the ``invoke_agent`` span itself, with those ids, its real start time and
the run's vitals — so an operator restart mid-run loses nothing.

Export follows the standard environment: ``OTEL_TRACES_EXPORTER`` (``otlp`` or ``console``),
``OTEL_EXPORTER_OTLP_ENDPOINT`` (implies ``otlp``), ``OTEL_SERVICE_NAME``. With none set,
nothing is exported. Message contents and tool arguments are never recorded unless
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` (they may hold secrets).

Conventions: https://opentelemetry.io/docs/specs/semconv/gen-ai/ (gen-ai-spans, gen-ai-agent-
spans, gen-ai-metrics): span names ``invoke_agent {agent}``, ``chat {model}``,
``execute_tool {tool}``; attributes ``gen_ai.operation.name``, ``gen_ai.provider.name``,
``gen_ai.request.model``, ``gen_ai.usage.input_tokens``/``output_tokens``,
``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``error.type``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

PROVIDER_NAME = "openai"
"""``gen_ai.provider.name``: agentrun speaks the OpenAI chat-completions API to every model."""
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_PROPAGATOR = TraceContextTextMapPropagator()
_preset: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "agentrun_preset_ids", default=None
)


class PresetIdGenerator(RandomIdGenerator):
    """Random ids, except inside ``preset_ids``: then the given trace and span id.

    Lets the operator emit the run span at the run's end with the ids it minted (and handed to
    every child span) at admission.
    """

    def generate_span_id(self) -> int:
        """The preset span id, or a random one."""
        preset = _preset.get()
        return preset[1] if preset else super().generate_span_id()

    def generate_trace_id(self) -> int:
        """The preset trace id, or a random one."""
        preset = _preset.get()
        return preset[0] if preset else super().generate_trace_id()


@contextlib.contextmanager
def preset_ids(trace_id: int, span_id: int) -> Iterator[None]:
    """Spans started in this block (without a parent) get these ids."""
    token = _preset.set((trace_id, span_id))
    try:
        yield
    finally:
        _preset.reset(token)


def _one_line(span: ReadableSpan) -> str:
    return str(span.to_json(indent=None)) + "\n"


def _exporter() -> SpanExporter | None:
    choice = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not choice and os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        choice = "otlp"
    if choice == "console":
        return ConsoleSpanExporter(out=sys.stdout, formatter=_one_line)
    if choice == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    return None


SPAN_ATTRIBUTE_MAX_CHARS = 4_096
"""Characters a span attribute's string value keeps (the SDK cuts it; default unbounded),
unless ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` or ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``
says otherwise. Attributes carry what a model endpoint or a tool server chose (a response's
``id``: up to a message's 8 MiB), and the batch processor holds up to 2,048 finished spans in
the process's memory before export."""
_LENGTH_LIMITS = ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")


def span_limits() -> SpanLimits:
    """The SDK's limits, attribute values cut at ``SPAN_ATTRIBUTE_MAX_CHARS`` unless the
    environment names a length limit of its own."""
    if any(os.environ.get(name) for name in _LENGTH_LIMITS):
        return SpanLimits()
    return SpanLimits(max_span_attribute_length=SPAN_ATTRIBUTE_MAX_CHARS)


def tracer_provider(exporter: SpanExporter, *, service_name: str) -> TracerProvider:
    """A tracer provider batching finished spans to ``exporter`` (``span_limits``)."""
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    resource = Resource.create({"service.name": name, "process.pid": os.getpid()})
    provider = TracerProvider(
        resource=resource, id_generator=PresetIdGenerator(), span_limits=span_limits()
    )
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    return provider


def setup_tracing(service_name: str) -> TracerProvider | None:
    """Install a tracer provider exporting as the environment says (``tracer_provider``);
    ``None`` (no export) if nothing is configured. Call once per process, before any span."""
    exporter = _exporter()
    if exporter is None:
        return None
    provider = tracer_provider(exporter, service_name=service_name)
    trace.set_tracer_provider(provider)
    return provider


def tracer() -> trace.Tracer:
    """agentrun's tracer (a no-op one when tracing is not set up)."""
    return trace.get_tracer("agentrun")


def capture_content() -> bool:
    """Whether message contents and tool arguments may be recorded on spans."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"


def mint_traceparent() -> str:
    """A fresh W3C ``traceparent`` for a run's span (sampled)."""
    ids = RandomIdGenerator()
    return f"00-{ids.generate_trace_id():032x}-{ids.generate_span_id():016x}-01"


def parse_traceparent(value: str) -> tuple[int, int] | None:
    """``(trace_id, span_id)`` of a version-00 ``traceparent``, or ``None`` if malformed."""
    parts = value.split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        return int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


def context_of(traceparent: str | None) -> Any:
    """An OpenTelemetry context whose parent is the span ``traceparent`` names."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    return _PROPAGATOR.extract(carrier)


def inject(headers: MutableMapping[str, str], traceparent: str | None) -> None:
    """Put the run's ``traceparent`` into NATS headers."""
    if traceparent:
        headers["traceparent"] = traceparent


@dataclasses.dataclass(frozen=True, slots=True)
class RunSpan:
    """A finished run, as its ``invoke_agent`` span reports it."""

    traceparent: str | None
    """The run's W3C ``traceparent`` (minted at admission); ``None``: no span is emitted."""
    name: str
    """The AgentRun's name (``gen_ai.agent.name``)."""
    run_uid: str
    """The AgentRun's uid (``gen_ai.agent.id``)."""
    model: str
    """The requested model (``gen_ai.request.model``)."""
    start: float
    """Admission time, epoch seconds."""
    end: float
    """The terminal event's time, epoch seconds."""
    vitals: Mapping[str, Any]
    """Further span attributes (usage, terminal reason, counters); ``None`` values are left out."""
    error_type: str | None
    """``error.type`` for a run that did not complete (its terminal reason), else ``None``."""


def emit_run_span(run: RunSpan) -> None:
    """Emit the finished ``invoke_agent`` span of a run (GenAI semantic conventions)."""
    traceparent, name, error_type = run.traceparent, run.name, run.error_type
    ids = parse_traceparent(traceparent or "")
    if ids is None:
        return
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": PROVIDER_NAME,
        "gen_ai.agent.name": name,
        "gen_ai.agent.id": run.run_uid,
        "gen_ai.request.model": run.model,
        **{k: v for k, v in run.vitals.items() if v is not None},
    }
    if error_type:
        attributes["error.type"] = error_type
    with preset_ids(*ids):
        span = tracer().start_span(
            f"invoke_agent {name}",
            context=trace.set_span_in_context(trace.INVALID_SPAN),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=int(run.start * 1e9),
        )
    if error_type:
        span.set_status(trace.Status(trace.StatusCode.ERROR, error_type))
    span.end(end_time=int(run.end * 1e9))


def remote_parent(traceparent: str | None) -> SpanContext | None:
    """The run span's context as a remote parent (for tests and diagnostics)."""
    ids = parse_traceparent(traceparent or "")
    if ids is None:
        return None
    return SpanContext(ids[0], ids[1], is_remote=True, trace_flags=TraceFlags(1))


def arguments_json(arguments: Mapping[str, Any]) -> str:
    """Tool arguments as recorded on a span when content capture is on."""
    return json.dumps(arguments, separators=(",", ":"), sort_keys=True)
