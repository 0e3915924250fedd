"""OpenTelemetry spans for the control loop: webhook notifications, lease changes, rejections,
retries.

Warden keeps its own TracerProvider so it neither depends on nor disturbs vLLM's tracing. Spans
are exported over OTLP/HTTP when the standard OTel environment variables ask for it
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_TRACES_EXPORTER=otlp``); tests add an in-memory exporter instead.

With nowhere to send them, spans are not made at all (``tracer`` is a no-op tracer): a
recorded span that no processor reads, and a tracer looked up per span, cost the API server
about 0.7 ms of CPU per refusal, on the core the engine computes on when they share one
(benchmarks/README.md, issue #28).
"""

from __future__ import annotations

import os
import threading

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)

_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None  # warden's tracer, once looked up
_exporting = False  # a span processor is on the provider: spans go somewhere
_NO_SPANS = trace.NoOpTracer()
_lock = threading.Lock()


def _otlp_requested() -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_TRACES_EXPORTER", "").lower() == "otlp"
    )


def provider() -> TracerProvider:
    global _provider, _exporting
    with _lock:
        if _provider is None:
            name = os.environ.get("OTEL_SERVICE_NAME", "vllm-warden")
            _provider = TracerProvider(resource=Resource.create({"service.name": name}))
            if _otlp_requested():
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
                _exporting = True
        return _provider


def add_exporter(exporter: SpanExporter) -> None:
    """Send spans to ``exporter`` as they end (tests: an InMemorySpanExporter)."""
    global _exporting
    provider().add_span_processor(SimpleSpanProcessor(exporter))
    with _lock:
        _exporting = True


def tracer() -> trace.Tracer:
    """Warden's tracer, or a no-op one while no exporter is set (no span would be read)."""
    global _tracer
    if _tracer is not None:
        return _tracer
    made = _provider or provider()
    if not _exporting:
        return _NO_SPANS
    with _lock:
        if _tracer is None:
            _tracer = made.get_tracer("warden.control")
        return _tracer
