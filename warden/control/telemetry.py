"""OpenTelemetry spans for the control loop: webhook notifications, lease changes, rejections,
retries.

Warden keeps its own TracerProvider so it neither depends on nor disturbs vLLM's tracing. Spans
are exported over OTLP/HTTP when the standard OTel environment variables ask for it
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_TRACES_EXPORTER=otlp``); tests add an in-memory exporter instead.
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
_lock = threading.Lock()


def _otlp_requested() -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_TRACES_EXPORTER", "").lower() == "otlp"
    )


def provider() -> TracerProvider:
    global _provider
    with _lock:
        if _provider is None:
            name = os.environ.get("OTEL_SERVICE_NAME", "vllm-warden")
            _provider = TracerProvider(resource=Resource.create({"service.name": name}))
            if _otlp_requested():
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return _provider


def add_exporter(exporter: SpanExporter) -> None:
    """Send spans to ``exporter`` as they end (tests: an InMemorySpanExporter)."""
    provider().add_span_processor(SimpleSpanProcessor(exporter))


def tracer() -> trace.Tracer:
    return provider().get_tracer("warden.control")
