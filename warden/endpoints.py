"""vLLM endpoint plugin: warden's routes on the API server's own port.

Registered under ``vllm.endpoint_plugins`` (it must be named in VLLM_PLUGINS). ``init_state``
is where warden gets the engine client: the stall detector reads its in-flight request count.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse

from exporter.catalog import WATERMARK_LEVELS
from exporter.step_monitor import process_monitor

router = APIRouter()


@router.get("/warden/state")
async def warden_state() -> JSONResponse:
    monitor = process_monitor()
    if monitor is None:
        return JSONResponse({"watermark": None, "engine": None})
    snap = monitor.snapshot
    return JSONResponse(
        {
            "watermark": WATERMARK_LEVELS[snap.watermark],
            "watermark_source": monitor.watermark.worst_source,
            "signals": snap.signals,
            "engine": {
                "last_step_timestamp": snap.timestamp,
                "running": snap.running,
                "waiting": snap.waiting,
                "kv_cache_usage": snap.kv_cache_usage,
            },
        }
    )


def _inflight_counter(engine_client: Any) -> Any:
    processor = getattr(engine_client, "output_processor", None)
    if processor is None or not hasattr(processor, "get_num_unfinished_requests"):
        return None
    return processor.get_num_unfinished_requests


class WardenEndpoints:
    name = "warden_endpoints"
    required_tasks = None

    def attach_router(self, app: FastAPI) -> None:
        from warden import health

        app.include_router(router)
        app.include_router(health.router)

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        monitor = process_monitor()
        if monitor is not None and engine_client is not None:
            monitor.inflight = _inflight_counter(engine_client)
