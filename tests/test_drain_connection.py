"""A refusal while the supervisor drains the engine closes the connection; others keep it.

Draining comes before a planned restart: the server a client reaches is about to go away, and a
client that kept the connection would have its next request reset under it. Any other refusal
keeps the connection (tests/test_admission_engine.py checks that on a live engine)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporter.metrics import WardenMetrics
from tests.support.asgi import post_json
from warden.control.actions import ActionRequest
from warden.control.config import ControlConfig
from warden.control.controller import Controller
from warden.control.leases import DRAIN_LEASE_KEY
from warden.engine import middleware
from warden.engine.runtime import EngineRuntime


@pytest.fixture
def rt() -> EngineRuntime:
    control = Controller(ControlConfig(), WardenMetrics(CollectorRegistry()))
    return EngineRuntime(control, WardenMetrics(CollectorRegistry()))


async def never_called(scope: dict, receive: Any, send: Any) -> None:
    raise AssertionError("a refused request reached the engine")


def refusal_headers(rt: EngineRuntime) -> dict[bytes, bytes]:
    door = middleware.WardenMiddleware(never_called, rt)
    sent = post_json(door, {"prompt": "hi", "max_tokens": 2})
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 503
    return dict(start["headers"])


def test_a_drain_refusal_closes_the_connection(rt: EngineRuntime) -> None:
    rt.control.set_manual(DRAIN_LEASE_KEY, ActionRequest("stop_admission"), 60.0)
    headers = refusal_headers(rt)
    assert headers.get(b"connection") == b"close"
    assert headers.get(b"retry-after")


def test_another_manual_refusal_keeps_the_connection(rt: EngineRuntime) -> None:
    rt.control.set_manual("maintenance", ActionRequest("stop_admission"), 60.0)
    headers = refusal_headers(rt)
    assert b"connection" not in headers
    assert headers.get(b"retry-after")
