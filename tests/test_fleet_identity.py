"""An engine applies only the alerts about itself (#12 item 1).

The identity check itself (pure), the controller counting foreign alerts and leaving its leases
alone, and the webhook served for real over TCP, where the default identity is the host:port
the request reached (loopback names, the address itself, or a name that resolves to it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from exporter import catalog
from exporter.metrics import WardenMetrics
from tests.support.alertmanager import webhook_notification
from tests.support.asgi import serving
from warden.control.alertmanager import parse_payload
from warden.control.config import ControlConfig
from warden.control.controller import Controller
from warden.control.identity import EngineIdentity
from warden.engine import identity as engine_identity
from warden.engine import runtime, webhook
from warden.engine.runtime import EngineRuntime

# The test clock: after every alert in these tests starts (their times are believed).
NOW = 1_795_269_600.0  # 2026-11-21T14:00:00Z

TOKEN = "identity-test-token"
ACTION = {catalog.ACTION_LABEL: "stop_admission"}


def alert(status: str = "firing", fingerprint: str = "fp1", **labels: str) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": "WardenTest", **ACTION, **labels},
        "annotations": {"summary": "x"},
        "startsAt": "2026-11-21T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-21T11:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fingerprint,
    }


def notification(*alerts: dict[str, Any]) -> dict[str, Any]:
    return webhook_notification(*alerts, receiver="warden-engine")


# --- the rule ---------------------------------------------------------------------------------
POD = EngineIdentity(frozenset({"vllm-7c9f-x2"}), {"namespace": "prod"})


@pytest.mark.parametrize(
    ("labels", "mine", "why"),
    [
        ({"instance": "vllm-7c9f-x2", "namespace": "prod"}, True, ""),
        ({"instance": "vllm-7c9f-x2"}, True, ""),  # rules without namespace still name it
        ({"instance": "vllm-7c9f-x2", "namespace": "staging"}, False, "namespace 'staging'"),
        ({"instance": "vllm-other", "namespace": "prod"}, False, "instance 'vllm-other'"),
        ({"namespace": "prod"}, False, "fleet-wide"),
        ({"instance": ""}, False, "fleet-wide"),
    ],
)
def test_an_alert_is_for_this_engine_only_when_its_identity_labels_name_it(
    labels: dict[str, str], mine: bool, why: str
) -> None:
    assert POD.accepts(labels) is mine
    refusal = POD.refusal(labels)
    assert (refusal is None) is mine
    if not mine:
        assert why in str(refusal)


# --- the controller ---------------------------------------------------------------------------
@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def controller(registry: CollectorRegistry) -> Controller:
    return Controller(ControlConfig(), WardenMetrics(registry), clock=lambda: NOW)


def apply(controller: Controller, identity: EngineIdentity, *alerts: dict[str, Any]) -> dict:
    events = parse_payload(json.dumps(notification(*alerts)).encode())
    return controller.apply_alerts(events, identity)


def test_foreign_and_fleet_wide_alerts_are_counted_and_change_nothing(
    controller: Controller,
) -> None:
    me = EngineIdentity(frozenset({"b:8000"}))
    before = controller.state_json()
    counts = apply(
        controller,
        me,
        alert(fingerprint="fa", instance="a:8000"),
        alert(fingerprint="fc", instance="c:8000"),
        alert(fingerprint="ff"),  # fleet-wide: no instance
    )
    assert counts == {"not_for_this_engine": 3}
    assert controller.state_json()["leases"] == before["leases"] == []
    assert not controller.policy().stop_admission


def test_in_a_mixed_notification_only_this_engines_alert_takes_a_lease(
    controller: Controller,
) -> None:
    me = EngineIdentity(frozenset({"b:8000"}))
    counts = apply(
        controller,
        me,
        alert(fingerprint="fa", instance="a:8000"),
        alert(fingerprint="fb", instance="b:8000"),
    )
    assert counts == {"not_for_this_engine": 1, "applied": 1}
    leases = controller.state_json()["leases"]
    assert [lease["key"] for lease in leases] == ["fb"]
    # A resolved notification about another engine cannot release this engine's lease.
    resolved_elsewhere = apply(controller, me, alert("resolved", "fb", instance="a:8000"))
    assert resolved_elsewhere == {"not_for_this_engine": 1}
    assert controller.policy().stop_admission
    assert apply(controller, me, alert("resolved", "fb", instance="b:8000")) == {"released": 1}
    assert not controller.policy().stop_admission


# --- the webhook, over TCP ----------------------------------------------------------------------
@pytest.fixture
def webhook_app(
    controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[FastAPI, Controller]]:
    monkeypatch.setenv("WARDEN_WEBHOOK_TOKEN", TOKEN)
    for name in ("WARDEN_WEBHOOK_TOKEN_FILE", "WARDEN_INSTANCE", "WARDEN_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    engine_identity.reset()
    app = FastAPI()
    runtime.install(app, EngineRuntime(controller, WardenMetrics(CollectorRegistry())))
    app.include_router(webhook.router)
    yield app, controller
    engine_identity.reset()


def post(base_url: str, *alerts: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(
        f"{base_url}/warden/alertmanager",
        json=notification(*alerts),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def counted(registry: CollectorRegistry, outcome: str) -> float:
    value = registry.get_sample_value(catalog.WEBHOOK_NOTIFICATIONS.name, {"outcome": outcome})
    return value or 0.0


def test_by_default_the_engine_is_the_host_port_the_request_reached(
    webhook_app: tuple[FastAPI, Controller], registry: CollectorRegistry
) -> None:
    app, controller = webhook_app
    with serving(app, host="127.0.0.1") as url:
        port = int(url.rsplit(":", 1)[1])
        other_port = alert(fingerprint="f1", instance=f"127.0.0.1:{port + 1}")
        other_host = alert(fingerprint="f2", instance=f"127.0.0.9:{port}")
        unresolvable = alert(fingerprint="f3", instance=f"no-such-engine.invalid:{port}")
        answer = post(url, other_port, other_host, unresolvable)
        assert answer["alerts"] == {"not_for_this_engine": 3}
        assert counted(registry, "not_for_this_engine") == 3
        assert controller.state_json()["leases"] == []

        # The address itself, a loopback name, and a name that resolves here (host names are
        # case-insensitive, so LOCALHOST goes through the resolver, not the alias list).
        for fingerprint, host in (("m1", "127.0.0.1"), ("m2", "localhost"), ("m3", "LOCALHOST")):
            answer = post(url, alert(fingerprint=fingerprint, instance=f"{host}:{port}"))
            assert answer["alerts"] == {"applied": 1}, host
        assert {lease["key"] for lease in controller.state_json()["leases"]} == {"m1", "m2", "m3"}


def test_warden_instance_names_the_engine_outright(
    webhook_app: tuple[FastAPI, Controller],
    registry: CollectorRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app, controller = webhook_app
    monkeypatch.setenv("WARDEN_INSTANCE", "vllm-0")
    monkeypatch.setenv("WARDEN_NAMESPACE", "prod")
    engine_identity.reset()
    with serving(app) as url:
        port = int(url.rsplit(":", 1)[1])
        answer = post(
            url,
            alert(fingerprint="f1", instance=f"127.0.0.1:{port}"),  # the address: not its name
            alert(fingerprint="f2", instance="vllm-0", namespace="staging"),
            alert(fingerprint="f3", instance="vllm-0", namespace="prod"),
        )
    assert answer["alerts"] == {"not_for_this_engine": 2, "applied": 1}
    assert answer["identity"] == {"instances": ["vllm-0"], "labels": {"namespace": "prod"}}
    assert [lease["key"] for lease in controller.state_json()["leases"]] == ["f3"]
    assert counted(registry, "not_for_this_engine") == 2
