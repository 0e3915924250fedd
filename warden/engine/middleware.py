"""ASGI middleware in vLLM's API server: admission control and transparent retries.

Every request that can start work passes admission (``warden.engine.routes``: all methods but
GET/HEAD/OPTIONS, on every route but an explicit allow-list, ``--root-path`` handled as the
router does; the verdict is worked out once per route and method). A request then goes
through three stages, each its own module, each before any work the next one needs:

1. ``admission_stage``: a request vLLM's own API-key check will refuse is handed to it
   untouched (401; no work here); then the policy's refusals from headers alone (503/429 with
   Retry-After and an OpenAI-style error naming the reason, its signal and value), the circuit
   breaker's half-open share let through by the controller's one gate;
2. ``body_stage``: the body bounded (413 on Content-Length, else while it streams) and, for
   routes whose JSON carries a token limit, parsed to a 4xx on any malformed input; the cap
   and the KV forecast (its inputs from ``forecast``);
3. ``retry_stage``, for completions, chat completions and responses: the attempt's tag and
   retries of transient failures, the stream passed through once its first byte is out.

Exempt routes that still work on the body (tokenize, count, render) are bounded in size too,
and closed under ``reject_all``. Every final outcome is counted in
``warden_requests_total{outcome}``. Pure ASGI: streams stay streams.
"""

from __future__ import annotations

from typing import Any

from exporter import api_metrics, catalog
from exporter.settings import load_settings
from warden.common.http_input import InputRefused
from warden.control import token_limits
from warden.engine import routes, runtime
from warden.engine.admission_stage import AdmissionStage
from warden.engine.asgi import Answers, Receive, Scope, Send, header_values
from warden.engine.body_stage import CONTENT_LENGTH, BodyStage
from warden.engine.metrics_route import METRICS_PATHS, MetricsRoute
from warden.engine.retry_stage import RetryStage


class WardenMiddleware:
    def __init__(self, app: Any, rt: runtime.EngineRuntime | None = None) -> None:
        """vLLM passes ``app`` alone: the process's runtime is built now (composition root),
        so an invalid config stops the server at start. Tests pass a runtime of their own."""
        self.app = app
        self.runtime = rt if rt is not None else runtime.process_runtime()
        self.control = self.runtime.control
        metrics = self.runtime.metrics
        self.answers = Answers(metrics.get(catalog.REQUESTS))
        self.door = AdmissionStage(app, self.control, self.answers)
        # The board's path read once: parsing the settings costs about a millisecond.
        self.retry = RetryStage(
            app,
            self.control,
            self.answers,
            load_settings().signal_board,
            metrics.get(catalog.NONFINITE_FLAG_WAIT),
        )
        self.body = BodyStage(app, self.runtime, self.answers, self.door, self.retry)
        self._headers = frozenset((*self.door.header_names(), CONTENT_LENGTH))
        # vLLM's own metrics in this process's memory: vLLM's /metrics would miss them.
        self.metrics_route = MetricsRoute() if api_metrics.serves_metrics() else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verdict, route = routes.verdict_of(scope)
        if (
            route in METRICS_PATHS
            and self.metrics_route
            and self.metrics_route.handles(scope, route)
        ):
            await self.metrics_route(scope, receive, send)
            return
        if verdict == routes.PASS or self.door.vllm_refuses_credentials(scope):
            await self.app(scope, receive, send)
            return
        headers = header_values(scope, self._headers)
        if verdict == routes.EXEMPT_BOUNDED:
            if await self.door.admit_exempt(scope, receive, send) and await self._head_ok(
                send, headers
            ):
                await self.body.forward_bounded(scope, receive, send, count=False)
            return
        reads_body = token_limits.reads_json_body(route)
        # Saturation for a route whose body is read waits for it: the body tells a refused
        # client's return from a new arrival (warden.control.saturation.RetrySchedule).
        admitted = await self.door.admit(scope, receive, send, headers, reads_body)
        if admitted is None:
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        if not await self._head_ok(send, headers):
            return
        if reads_body:
            await self.body.handle(scope, receive, send, route, admitted)
        else:
            await self.body.forward_bounded(scope, receive, send)

    async def _head_ok(self, send: Send, headers: dict[bytes, str]) -> bool:
        """The declared length checked before a byte is read; False once refused."""
        try:
            self.body.check_head(headers)
        except InputRefused as exc:
            await self.answers.bad_request(send, exc.status, str(exc))
            return False
        return True
