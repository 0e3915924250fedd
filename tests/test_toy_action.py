"""Adding a degradation action takes one module and one registration line.

The toy action (tests/support/toy_action.py) is registered below, in the fixture, with one
line; nothing else in warden names it. The webhook (real HTTP into the engine's webhook app),
the manual override route and ``warden degrade`` (the CLI, over HTTP), the local reflex (its
config and its leases), admission (the refusal names its cause), the
``warden_degradation_active`` gauge the dashboards read and the generated docs all take it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.step_monitor import StepSnapshot
from tests.support import toy_action
from tests.support.alertmanager import webhook_notification
from tests.support.asgi import serving
from warden.cli import actions_doc
from warden.cli.main import main as warden_main
from warden.control.actions import REGISTRY, ActionError, parse_action
from warden.control.admission import RequestFacts
from warden.control.config import ControlConfigError, parse_config
from warden.control.controller import Controller
from warden.control.reflex import Reflex
from warden.engine import identity as engine_identity
from warden.engine import runtime, webhook
from warden.engine.runtime import EngineRuntime

TOKEN = "toy-action-token"
INSTANCE = "engine:8000"
TOY = toy_action.ACTION.name


@pytest.fixture
def toy() -> Iterator[None]:
    with REGISTRY.registered(toy_action.ACTION):  # the one registration line
        yield


def controller(registry: CollectorRegistry, **config: Any) -> Controller:
    return Controller(parse_config(config), WardenMetrics(registry))


@pytest.fixture
def engine_url(
    toy: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[str, Controller, CollectorRegistry]]:
    """The engine's real webhook routes, served over TCP, with a controller of their own."""
    registry = CollectorRegistry()
    control = controller(registry)
    monkeypatch.setenv("WARDEN_WEBHOOK_TOKEN", TOKEN)
    monkeypatch.delenv("WARDEN_WEBHOOK_TOKEN_FILE", raising=False)
    monkeypatch.setenv("WARDEN_INSTANCE", INSTANCE)
    engine_identity.reset()
    app = FastAPI()
    runtime.install(app, EngineRuntime(control, WardenMetrics(registry)))
    app.include_router(webhook.router)
    with serving(app) as url:
        yield url, control, registry
    engine_identity.reset()


def toy_alert(status: str, level: str) -> dict[str, Any]:
    starts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    return {
        "status": status,
        "labels": {
            "alertname": "ToyPressure",
            "instance": INSTANCE,
            catalog.ACTION_LABEL: TOY,
            toy_action.LEVEL.label: level,
        },
        "annotations": {"description": "toy pressure 0.97"},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": "toy-fp",
    }


def test_the_webhook_applies_the_toy_action_and_admission_refuses_by_it(
    engine_url: tuple[str, Controller, CollectorRegistry],
) -> None:
    url, control, registry = engine_url
    answer = httpx.post(
        f"{url}/warden/alertmanager",
        json=webhook_notification(toy_alert("firing", "3")),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["alerts"] == {"applied": 1}
    assert body["policy"]["toy_level"] == 3
    (lease,) = body["leases"]
    assert lease["action"] == TOY
    assert lease["cause"] == {"signal": "ToyPressure", "value": "toy pressure 0.97"}
    # The gauge the dashboards draw, by its action label.
    active = registry.get_sample_value(catalog.DEGRADATION_ACTIVE.name, {"action": TOY})
    assert active == 1
    # Admission: the toy refuses what it should, names its cause, lets the rest through.
    refused = control.decide(RequestFacts(priority=5))
    assert (refused.admit, refused.status, refused.reason) == (False, 503, "toy_hold")
    assert (refused.signal, refused.value) == ("ToyPressure", "toy pressure 0.97")
    assert control.decide(RequestFacts(priority=2)).admit
    # A bad parameter is a 200 naming the refused alert (Alertmanager never retries a 4xx).
    bad = httpx.post(
        f"{url}/warden/alertmanager",
        json=webhook_notification({**toy_alert("firing", "300"), "fingerprint": "toy-bad"}),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert bad.status_code == 200, bad.text
    assert "applied" not in bad.json()["alerts"]
    assert [x["key"] for x in control.state_json()["leases"]] == ["toy-fp"]


def test_the_manual_cli_sets_and_clears_the_toy_action(
    engine_url: tuple[str, Controller, CollectorRegistry],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, control, _registry = engine_url
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    common = ["degrade", "--engine-url", url, "--token-file", str(token_file)]
    assert warden_main([*common, "set", TOY, "--param", "level=4", "--ttl", "60"]) == 0
    assert '"toy_level": 4' in capsys.readouterr().out
    (lease,) = control.leases.live(time.time())
    assert (lease.source, lease.action, lease.params) == ("manual", TOY, {"level": 4})
    assert control.policy().toy_level == 4
    assert warden_main([*common, "set", TOY, "--param", "level=nope"]) == 1  # 400, said why
    assert "level" in capsys.readouterr().err
    assert warden_main([*common, "clear", "--key", TOY]) == 0
    assert control.policy().toy_level is None


def test_the_reflex_takes_the_toy_action_from_its_config(toy: None) -> None:
    registry = CollectorRegistry()
    control = controller(registry, reflex={"critical": {"actions": [TOY], "preempt": 0}})
    reflex = Reflex(control.config.reflex, control)
    reflex(StepSnapshot(watermark=2, watermark_source="device", watermark_value=0.93))
    policy = control.policy()
    assert policy.toy_level == toy_action.LEVEL.fallback  # the lease did not say: the default
    assert policy.cause(TOY).signal == "memory_watermark"
    taken = registry.get_sample_value(catalog.REFLEX_ACTIONS.name, {"action": TOY})
    assert taken == 1
    assert not control.decide(RequestFacts(priority=9)).admit


def test_the_docs_list_the_toy_action_and_forget_it_once_unregistered(toy: None) -> None:
    text = actions_doc.render()
    (row,) = [line for line in text.splitlines() if line.startswith(f"| `{TOY}`")]
    assert toy_action.LEVEL.label in row and "| yes |" in row  # its label; the reflex may
    assert parse_action(TOY, {toy_action.LEVEL.label: "2"}).params == {"level": 2}


def test_without_the_registration_line_nothing_takes_it() -> None:
    assert TOY not in actions_doc.render()
    with pytest.raises(ActionError, match="unknown action"):
        parse_action(TOY, {})
    with pytest.raises(ControlConfigError, match="not an action the reflex can take"):
        parse_config({"reflex": {"critical": {"actions": [TOY]}}})
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        warden_main(["degrade", "set", TOY])
    assert set(REGISTRY.names()) == set(catalog.DEGRADATION_ACTIONS)
