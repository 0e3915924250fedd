"""The engine runtime is passed in: the endpoint plugin gives its own runtime to the routes and
attaches the engine to it, so a test (or a second app) needs no process-wide state.

The engine client here is a fake (no model loads): it has the attributes vLLM's client has that
warden reads (the KV cache's geometry, the output processor's unfinished count).
"""

from __future__ import annotations

import asyncio
from argparse import Namespace
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.settings import WardenSettings
from exporter.step_monitor import StepMonitor
from exporter.vllm_compat import EngineRequests
from warden.common import tokens
from warden.control.actions import ActionRequest
from warden.control.config import AdmissionSettings, ControlConfig, SaturationSettings
from warden.engine import runtime
from warden.engine.endpoints import WardenEndpoints
from warden.engine.runtime import EngineRuntime


class FakeEngineClient:
    """Stands in for vLLM's engine client: 64 KV blocks of 16 tokens, 3 requests unfinished."""

    def __init__(self) -> None:
        cache = SimpleNamespace(num_gpu_blocks=64, block_size=16)
        self.vllm_config = SimpleNamespace(cache_config=cache)
        self.output_processor = SimpleNamespace(get_num_unfinished_requests=lambda: 3)


def served(rt: EngineRuntime, engine: Any) -> TestClient:
    """An app built the way vLLM builds it: routes attached, then the engine's state."""
    plugin = WardenEndpoints(rt)
    app = FastAPI()
    plugin.attach_router(app)
    asyncio.run(plugin.init_state(engine, app.state, Namespace()))
    return TestClient(app)


def test_the_plugin_gives_its_runtime_and_the_engine_to_the_routes() -> None:
    monitor = StepMonitor(WardenSettings(), WardenMetrics(CollectorRegistry()), None)
    rt = EngineRuntime.build(monitor=monitor)
    engine = FakeEngineClient()
    client = served(rt, engine)
    assert rt.engine_client is engine
    assert monitor.pending_requests() == 3  # the monitor counts the engine's in-flight requests
    rt.control.set_manual("maintenance", ActionRequest("stop_admission"), 60.0)
    state = client.get("/warden/state").json()
    assert state["kv_cache"] == {"total_blocks": 64, "block_size": 16}
    assert [lease["key"] for lease in state["leases"]] == ["maintenance"]
    assert state["watermark"] == catalog.WATERMARK_LEVELS[0]  # from this runtime's monitor


def test_the_step_monitor_reads_served_requests_only_where_a_saturation_limit_is_set() -> None:
    """The default config decides nothing on the queue's wait: its step path reads nothing
    more. With an SLO set, the exported wait reads the ages admission reads."""
    plain = StepMonitor(WardenSettings(), WardenMetrics(CollectorRegistry()), None)
    served(EngineRuntime.build(monitor=plain), FakeEngineClient())
    assert plain.served_requests is None
    limited = StepMonitor(WardenSettings(), WardenMetrics(CollectorRegistry()), None)
    slo = ControlConfig(admission=AdmissionSettings(saturation=SaturationSettings(latency_slo_s=3)))
    served(EngineRuntime.build(slo, monitor=limited), FakeEngineClient())
    assert limited.served_requests is not None and limited.served_requests() == EngineRequests()


def test_the_saturation_state_is_summed_up_at_every_step_only_where_a_limit_decides_on_it() -> None:
    """Without a saturation limit only the gauges and /warden/state read the meter's state:
    it is summed up when they are set (exporter/step_monitor.py); with one, at every step."""
    plain = StepMonitor(WardenSettings(), WardenMetrics(CollectorRegistry()), None)
    assert plain.saturation_every_step  # the monitor's own default: exact at every step
    served(EngineRuntime.build(monitor=plain), FakeEngineClient())
    assert not plain.saturation_every_step
    limited = StepMonitor(WardenSettings(), WardenMetrics(CollectorRegistry()), None)
    slo = ControlConfig(admission=AdmissionSettings(saturation=SaturationSettings(latency_slo_s=3)))
    served(EngineRuntime.build(slo, monitor=limited), FakeEngineClient())
    assert limited.saturation_every_step


def test_two_runtimes_do_not_share_a_controller() -> None:
    first, second = EngineRuntime.build(), EngineRuntime.build()
    first.control.set_manual("maintenance", ActionRequest("stop_admission"), 60.0)
    assert first.control.policy().stop_admission
    assert not second.control.policy().stop_admission
    assert served(second, None).get("/warden/degrade").json()["leases"] == []


def test_the_process_runtime_is_built_once() -> None:
    assert runtime.process_runtime() is runtime.process_runtime()


def test_each_runtime_reads_its_own_webhook_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard belongs to the runtime: a token set before a runtime's first guarded request
    is the one it checks, and a runtime with no token refuses (403) and changes nothing."""
    for name in (tokens.TOKEN_FILE_ENV, tokens.TOKEN_ENV, tokens.INSECURE_ENV):
        monkeypatch.delenv(name, raising=False)
    lease = {"key": "maintenance", "action": "stop_admission", "ttl_s": 60}
    closed = EngineRuntime.build()
    assert served(closed, None).post("/warden/degrade", json=lease).status_code == 403
    assert not closed.control.policy().stop_admission
    monkeypatch.setenv(tokens.TOKEN_ENV, "first-runtime-token")
    first = served(EngineRuntime.build(), None)
    monkeypatch.setenv(tokens.TOKEN_ENV, "second-runtime-token")
    second_rt = EngineRuntime.build()
    second = served(second_rt, None)
    bearer = {"Authorization": "Bearer second-runtime-token"}
    assert second.post("/warden/degrade", json=lease, headers=bearer).status_code == 200
    assert second_rt.control.policy().stop_admission
    # The first runtime reads its token at its first guarded request: the environment's now.
    assert first.post("/warden/degrade", json=lease, headers=bearer).status_code == 200
    wrong = {"Authorization": "Bearer first-runtime-token"}
    assert second.post("/warden/degrade", json=lease, headers=wrong).status_code == 401
