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

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.settings import WardenSettings
from exporter.step_monitor import StepMonitor
from warden.control.actions import ActionRequest
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


def test_two_runtimes_do_not_share_a_controller() -> None:
    first, second = EngineRuntime.build(), EngineRuntime.build()
    first.control.set_manual("maintenance", ActionRequest("stop_admission"), 60.0)
    assert first.control.policy().stop_admission
    assert not second.control.policy().stop_admission
    assert served(second, None).get("/warden/degrade").json()["leases"] == []


def test_the_process_runtime_is_built_once() -> None:
    assert runtime.process_runtime() is runtime.process_runtime()
