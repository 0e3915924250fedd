"""The control loop's OpenTelemetry spans, read from the SDK's in-memory exporter.

The real Controller with its own registry and an injected clock; the middleware and the webhook
route driven in-process around it (no engine). Each test checks the span's name and the
attributes an operator filters on, so a span or attribute that disappears fails here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.step_monitor import StepSnapshot
from tests.support.alertmanager import webhook_notification
from tests.support.asgi import post_json
from warden.control import telemetry
from warden.control.actions import ActionRequest
from warden.control.alertmanager import parse_payload
from warden.control.config import ControlConfig
from warden.control.controller import Controller
from warden.control.reflex import Reflex
from warden.engine import identity as engine_identity
from warden.engine import middleware, runtime, webhook
from warden.engine.runtime import EngineRuntime

# The test clock: after every alert in these tests starts (their times are believed).
NOW = 1_795_269_600.0  # 2026-11-21T14:00:00Z

TTL_S = ControlConfig().leases.ttl_s
ALERTNAME = "WardenMemoryWatermarkHigh"
TOKEN = "span-test-token"


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """One exporter on warden's tracer provider for the module (processors cannot be removed:
    it is shut down afterwards, so it keeps nothing from later tests)."""
    memory = InMemorySpanExporter()
    telemetry.add_exporter(memory)
    yield memory
    memory.shutdown()


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    exporter.clear()
    yield exporter
    exporter.clear()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def controller(clock: Clock) -> Controller:
    return Controller(ControlConfig(), WardenMetrics(CollectorRegistry()), clock=clock)


def alert(status: str, fingerprint: str = "fp1", **labels: str) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": ALERTNAME, "instance": "engine:8000", **labels},
        "annotations": {"summary": "x"},
        "startsAt": "2026-11-21T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-21T11:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fingerprint,
    }


def notification(*alerts: dict[str, Any]) -> bytes:
    return json.dumps(webhook_notification(*alerts)).encode()


def apply(controller: Controller, *alerts: dict[str, Any]) -> dict[str, int]:
    return controller.apply_alerts(parse_payload(notification(*alerts)))


def finished(spans: InMemorySpanExporter) -> list[ReadableSpan]:
    return list(spans.get_finished_spans())


def only(spans: InMemorySpanExporter, name: str) -> Mapping[str, Any]:
    """The attributes of the one span called ``name`` (and no span of another name)."""
    got = finished(spans)
    assert [s.name for s in got] == [name], [s.name for s in got]
    return dict(got[0].attributes or {})


def has(attributes: Mapping[str, Any], **expected: Any) -> None:
    """Every expected ``warden.*`` attribute is there with its value (``__`` stands for ``.``)."""
    for key, value in expected.items():
        name = "warden." + key.replace("__", ".")
        assert name in attributes, f"span lacks {name}: {dict(attributes)}"
        assert attributes[name] == value, f"{name}: {attributes[name]!r} != {value!r}"


# --- leases ------------------------------------------------------------------------------------


def test_a_firing_alert_opens_a_lease_applied_span(
    controller: Controller, clock: Clock, spans: InMemorySpanExporter
) -> None:
    apply(controller, alert("firing", **{catalog.ACTION_LABEL: "stop_admission"}))
    has(
        only(spans, "warden.lease.applied"),
        action="stop_admission",
        source="alertmanager",
        lease__key="fp1",
        lease__expires_at=clock.now + TTL_S,
        alertname=ALERTNAME,
    )


def test_a_renewal_opens_no_span(
    controller: Controller, clock: Clock, spans: InMemorySpanExporter
) -> None:
    firing = alert("firing", **{catalog.ACTION_LABEL: "stop_admission"})
    apply(controller, firing)
    spans.clear()
    clock.now += 100
    assert apply(controller, firing) == {"renewed": 1}
    assert finished(spans) == []


def test_a_resolved_alert_opens_a_lease_released_span(
    controller: Controller, spans: InMemorySpanExporter
) -> None:
    apply(controller, alert("firing", **{catalog.ACTION_LABEL: "reject_all"}))
    spans.clear()
    apply(controller, alert("resolved", **{catalog.ACTION_LABEL: "reject_all"}))
    has(
        only(spans, "warden.lease.released"),
        action="reject_all",
        source="alertmanager",
        alertname=ALERTNAME,
    )


def test_a_lapsed_lease_opens_a_lease_expire_span(
    controller: Controller, clock: Clock, spans: InMemorySpanExporter
) -> None:
    apply(controller, alert("firing", **{catalog.ACTION_LABEL: "stop_admission"}))
    expires_at = clock.now + TTL_S
    spans.clear()
    clock.now += TTL_S - 1
    controller.policy()
    assert finished(spans) == []  # still live
    clock.now += 2
    assert not controller.policy().stop_admission
    has(
        only(spans, "warden.lease.expire"),
        action="stop_admission",
        source="alertmanager",
        lease__key="fp1",
        lease__expires_at=expires_at,
        alertname=ALERTNAME,
    )


def test_a_manual_override_opens_a_lease_applied_span(
    controller: Controller, clock: Clock, spans: InMemorySpanExporter
) -> None:
    controller.set_manual("drain", ActionRequest("stop_admission"), 60.0)
    has(
        only(spans, "warden.lease.applied"),
        action="stop_admission",
        source="manual",
        lease__key="drain",
        lease__expires_at=clock.now + 60.0,
    )


def test_the_reflex_holds_and_releases_with_spans(
    controller: Controller, clock: Clock, spans: InMemorySpanExporter
) -> None:
    reflex = Reflex(controller.config.reflex, controller, clock=clock)
    # critical: stop admission (high only warns, #10.2: a creep takes hours)
    reflex(StepSnapshot(watermark=2, waiting=0))
    has(
        only(spans, "warden.lease.applied"),
        action="stop_admission",
        source="reflex",
        lease__key="watermark:stop_admission",
        lease__expires_at=clock.now + controller.config.reflex.lease_ttl_s,
    )
    spans.clear()
    reflex(StepSnapshot(watermark=2, waiting=0))  # held, not yet half its life gone
    assert finished(spans) == []
    reflex(StepSnapshot(watermark=0, waiting=0))  # clear: the release delay starts
    clock.now += controller.config.reflex.release_delay_s
    spans.clear()
    reflex(StepSnapshot(watermark=0, waiting=0))
    has(
        only(spans, "warden.lease.released"),
        action="stop_admission",
        source="reflex",
        lease__key="watermark:stop_admission",
    )


# --- preemption --------------------------------------------------------------------------------


def engine_client(*tokens: int) -> SimpleNamespace:
    """An engine client as warden reads it: requests in flight with the KV tokens they hold."""
    states = {
        f"r{i}": SimpleNamespace(
            external_req_id=f"warden-{i:032x}", prompt_len=count, detokenizer=None
        )
        for i, count in enumerate(tokens)
    }
    return SimpleNamespace(output_processor=SimpleNamespace(request_states=states))


def test_a_preemption_request_opens_a_preempt_span(
    controller: Controller, spans: InMemorySpanExporter
) -> None:
    controller.engine_client = engine_client(10, 300, 40)
    controller.preempt_largest(2, "critical")
    has(only(spans, "warden.preempt"), reason="critical", count=2)
    assert controller.was_preempted(f"warden-{1:032x}")


def test_an_alert_asking_to_preempt_opens_both_spans(
    controller: Controller, spans: InMemorySpanExporter
) -> None:
    controller.engine_client = engine_client(10, 300)
    labels = {catalog.ACTION_LABEL: "shed_low_priority", catalog.PARAM_PREEMPT: "1"}
    apply(controller, alert("firing", **labels))
    names = [s.name for s in finished(spans)]
    assert names == ["warden.lease.applied", "warden.preempt"], names
    has(dict(finished(spans)[1].attributes or {}), reason="alert", count=1)


def test_no_request_in_flight_opens_no_preempt_span(
    controller: Controller, spans: InMemorySpanExporter
) -> None:
    controller.engine_client = engine_client()
    controller.preempt_largest(1, "critical")
    assert finished(spans) == []


# --- rejections and retries (the admission middleware, in-process) -----------------------------


@pytest.fixture
def installed(controller: Controller) -> EngineRuntime:
    """A runtime around ``controller``, with metrics of its own."""
    return EngineRuntime(controller, WardenMetrics(CollectorRegistry()))


class Engine:
    """A stand-in vLLM route: answers each attempt with the next (status, body)."""

    def __init__(self, *answers: tuple[int, bytes]) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        status, body = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        await receive()
        head = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})


def post_completion(app: Any, body: dict[str, Any]) -> tuple[int, bytes]:
    sent = post_json(app, body)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_refused_request_opens_a_reject_span(
    installed: EngineRuntime, spans: InMemorySpanExporter
) -> None:
    installed.control.set_manual("drain", ActionRequest("stop_admission"), 60.0)
    spans.clear()
    engine = Engine((200, b"{}"))
    status, _ = post_completion(middleware.WardenMiddleware(engine, installed), {"prompt": "hi"})
    assert status == 503 and engine.calls == 0
    has(only(spans, "warden.reject"), reason="stop_admission", status=503)


def test_a_retried_request_opens_a_retry_span(
    installed: EngineRuntime, spans: InMemorySpanExporter
) -> None:
    engine = Engine((500, b'{"error": "CUDA out of memory"}'), (200, b'{"choices": []}'))
    status, _ = post_completion(middleware.WardenMiddleware(engine, installed), {"prompt": "hi"})
    assert status == 200 and engine.calls == 2
    has(only(spans, "warden.retry"), reason="engine_oom", attempt=2)


# --- the Alertmanager webhook route ------------------------------------------------------------


@pytest.fixture
def webhook_client(installed: EngineRuntime, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    """The webhook route on its own app, guarded by a token from the environment."""
    monkeypatch.setenv("WARDEN_WEBHOOK_TOKEN", TOKEN)
    monkeypatch.delenv("WARDEN_WEBHOOK_TOKEN_FILE", raising=False)
    monkeypatch.setenv("WARDEN_INSTANCE", "engine:8000")  # the instance the alerts name
    engine_identity.reset()
    app = FastAPI()
    runtime.install(app, installed)
    app.include_router(webhook.router)
    return TestClient(app)


def post_notification(client: TestClient, body: bytes, token: str = TOKEN) -> int:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return client.post("/warden/alertmanager", content=body, headers=headers).status_code


def test_a_webhook_notification_opens_a_webhook_span_around_the_lease(
    webhook_client: TestClient, spans: InMemorySpanExporter
) -> None:
    body = notification(alert("firing", **{catalog.ACTION_LABEL: "stop_admission"}))
    assert post_notification(webhook_client, body) == 200
    by_name = {s.name: s for s in finished(spans)}
    assert set(by_name) == {"warden.webhook", "warden.lease.applied"}
    attributes = dict(by_name["warden.webhook"].attributes or {})
    has(attributes, outcome="applied", alertnames=(ALERTNAME,))
    lease = by_name["warden.lease.applied"]
    assert lease.parent is not None  # inside the webhook's span
    assert lease.parent.span_id == by_name["warden.webhook"].context.span_id


@pytest.mark.parametrize(
    ("token", "body", "outcome"),
    [("wrong", notification(), "unauthorized"), (TOKEN, b"{not json", "malformed")],
)
def test_a_refused_notification_says_why_in_its_span(
    webhook_client: TestClient, spans: InMemorySpanExporter, token: str, body: bytes, outcome: str
) -> None:
    assert post_notification(webhook_client, body, token) in (400, 401)
    has(only(spans, "warden.webhook"), outcome=outcome)


def test_without_an_exporter_no_span_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nowhere to send spans (no OTLP variable, no exporter added): the tracer is a no-op, so
    a refusal costs no span; once an exporter is added, spans are made and reach it."""
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setattr(telemetry, "_provider", None)
    monkeypatch.setattr(telemetry, "_tracer", None)
    monkeypatch.setattr(telemetry, "_exporting", False)
    with telemetry.tracer().start_as_current_span("warden.reject") as span:
        assert not span.is_recording()
    memory = InMemorySpanExporter()
    telemetry.add_exporter(memory)
    with telemetry.tracer().start_as_current_span("warden.reject") as span:
        assert span.is_recording()
    assert [s.name for s in memory.get_finished_spans()] == ["warden.reject"]
    memory.shutdown()
