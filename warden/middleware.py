"""ASGI middleware in vLLM's API server: where warden meets each inference request.

Counts every inference request's outcome (``warden_requests_total{outcome}``), the basis of
the error-rate alert and circuit breaker. Pure ASGI, so streaming responses pass through
untouched. Health, metrics and warden endpoints are never touched.
"""

from __future__ import annotations

from typing import Any

from exporter import catalog
from exporter.metrics import process_metrics

INFERENCE_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses")

Scope = dict[str, Any]
Message = dict[str, Any]


def outcome_of(status: int) -> str:
    if status < 400:
        return "success"
    if status in (429, 503):
        return "rejected"
    return "client_error" if status < 500 else "server_error"


class WardenMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests = process_metrics().get(catalog.REQUESTS)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") not in INFERENCE_PATHS:
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def send_and_watch(message: Message) -> None:
            if message.get("type") == "http.response.start":
                status["code"] = int(message.get("status", 500))
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            self.requests.labels(outcome_of(status["code"])).inc()
