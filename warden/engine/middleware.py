"""ASGI middleware in vLLM's API server: admission control and transparent retries.

For completions, chat completions and responses it
- applies the effective policy (503/429 with Retry-After and an OpenAI-style error naming the
  reason, or a max_tokens cap written into the body) and the KV forecast;
- tags the request (``X-Request-Id`` and ``vllm_xargs.warden_rid``) so a warden preemption or
  non-finite logits can be traced back to it;
- retries transient failures (warden preemption, OOM-class errors, non-finite logits,
  timeouts) with backoff and jitter: non-streaming ones transparently, streaming ones only
  before their first byte, else the stream ends with an error event;
- counts every final outcome in ``warden_requests_total{outcome}``.
Health, metrics and warden endpoints pass straight through. Pure ASGI: streams stay streams.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from exporter import catalog, vllm_compat
from exporter.metrics import process_metrics
from exporter.request_args import ATTEMPT_ARG, RID_ARG
from exporter.settings import load_settings
from exporter.signals import SignalBoard
from exporter.step_monitor import process_monitor
from warden.control import telemetry
from warden.control.admission import Decision, HalfOpenGate, KvState, RequestFacts, decide
from warden.control.retry import TRANSIENT_REASONS, backoff_s, classify_failure
from warden.engine import flag_wait, runtime

log = logging.getLogger("warden.control")
INFERENCE_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MAX_REQUEST_BYTES = 64 << 20

Scope = dict[str, Any]
Message = dict[str, Any]
Send = Callable[[Message], Awaitable[None]]
Receive = Callable[[], Awaitable[Message]]


def replay_body(payload: bytes, receive: Receive) -> Receive:
    """A receive() that yields ``payload`` once, then waits on the real one (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        return await receive()

    return replay


def outcome_of(status: int) -> str:
    if status < 400:
        return "success"
    if status in (429, 503):
        return "rejected"
    return "client_error" if status < 500 else "server_error"


def _error_body(message: str, kind: str, code: int, reason: str) -> bytes:
    return json.dumps(
        {
            "error": {
                "message": message,
                "type": kind,
                "param": None,
                "code": code,
                "warden_reason": reason,
            }
        }
    ).encode()


def _priority(body: dict[str, Any], headers: dict[str, str], header_name: str) -> int:
    value = body.get("priority")
    if value is None:
        value = headers.get(header_name.lower())
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def _requested_max_tokens(body: dict[str, Any]) -> int | None:
    for name in TOKEN_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _prompt_text(path: str, body: dict[str, Any]) -> str | list[int] | None:
    if path == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return prompt
        return None
    messages = body.get("messages") if path == "/v1/chat/completions" else None
    if isinstance(messages, list):
        parts = [m.get("content") for m in messages if isinstance(m, dict)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return None


class WardenMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app
        # Builds the controller now: an invalid config stops the server at start.
        self.control = runtime.controller()
        self.requests = process_metrics().get(catalog.REQUESTS)
        self.gate = HalfOpenGate()
        self._board: SignalBoard | None = None
        self._tokenizer: Any = None

    # --- plumbing ---------------------------------------------------------------------

    @property
    def board(self) -> SignalBoard | None:
        if self._board is None:
            path = load_settings().signal_board
            if path and path.exists():
                self._board = SignalBoard(str(path))
        return self._board

    async def _reply(
        self, send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        head = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *(headers or []),
        ]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})
        self.requests.labels(outcome_of(status)).inc()

    async def _refuse(self, send: Send, decision: Decision) -> None:
        self.control.record_rejection(decision.reason)
        with telemetry.tracer().start_as_current_span("warden.reject") as span:
            span.set_attribute("warden.reason", decision.reason)
            span.set_attribute("warden.status", decision.status)
        kind = "invalid_request_error" if decision.status == 400 else "server_overloaded"
        headers = []
        if decision.retry_after_s:
            headers.append((b"retry-after", str(decision.retry_after_s).encode()))
        body = _error_body(decision.message, kind, decision.status, decision.reason)
        await self._reply(send, decision.status, body, headers)

    async def _prompt_tokens(self, path: str, body: dict[str, Any]) -> int | None:
        prompt = _prompt_text(path, body)
        if prompt is None:
            return None
        if isinstance(prompt, list):
            return len(prompt)
        client = self.control.engine_client
        if client is None:
            return None
        try:
            if self._tokenizer is None:
                tokenizer = client.get_tokenizer()  # sync in vLLM 0.32, async in older ones
                if inspect.isawaitable(tokenizer):
                    tokenizer = await tokenizer
                self._tokenizer = tokenizer
            return len(self._tokenizer.encode(prompt))
        except Exception:
            log.debug("warden: prompt not tokenized; forecast skipped", exc_info=True)
            return None

    def _kv_state(self) -> KvState | None:
        geometry = vllm_compat.kv_geometry(self.control.engine_client)
        monitor = process_monitor()
        if geometry is None or monitor is None:
            return None
        return KvState(geometry[0], geometry[1], monitor.snapshot.kv_cache_usage)

    # --- the request path -------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope.get("type") != "http"
            or scope.get("method") != "POST"
            or scope.get("path") not in INFERENCE_PATHS
        ):
            await self.app(scope, receive, send)
            return
        raw = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            raw.extend(message.get("body", b""))
            if len(raw) > MAX_REQUEST_BYTES:
                await self._reply(
                    send,
                    413,
                    _error_body(
                        "request body too large", "invalid_request_error", 413, "too_large"
                    ),
                )
                return
            if not message.get("more_body"):
                break
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = None
        if not isinstance(body, dict):
            # Not ours to judge: vLLM answers malformed requests itself.
            await self._forward_raw(scope, receive, send, bytes(raw))
            return
        await self._handle(scope, receive, send, body)

    async def _forward_raw(self, scope: Scope, receive: Receive, send: Send, raw: bytes) -> None:
        status = {"code": 500}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        await self.app(scope, replay_body(raw, receive), watch)
        self.requests.labels(outcome_of(status["code"])).inc()

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, body: dict[str, Any]
    ) -> None:
        path = scope["path"]
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        control = self.control
        settings = control.config
        policy = control.policy()
        prompt_tokens = None
        kv = None
        if settings.admission.forecast.enabled:
            kv = self._kv_state()
            if kv is not None:
                prompt_tokens = await self._prompt_tokens(path, body)
        facts = RequestFacts(
            priority=_priority(body, headers, settings.admission.priority_header),
            max_tokens=_requested_max_tokens(body),
            prompt_tokens=prompt_tokens,
        )
        decision = decide(facts, policy, settings.admission, self.gate, kv)
        if not decision.admit:
            await self._refuse(send, decision)
            return
        if decision.cap is not None:
            control.capped.inc()
            field = next((f for f in TOKEN_FIELDS if f in body), "max_tokens")
            if path == "/v1/responses":
                field = "max_output_tokens"
            body[field] = decision.cap
            if field != "max_tokens" and "max_tokens" in body:
                body["max_tokens"] = decision.cap
        stream = body.get("stream") is True
        tag = path != "/v1/responses"  # the responses API takes no vllm_xargs
        attempts = settings.retry.max_attempts
        original_seed = body.get("seed")
        original_priority = body.get("priority")
        preempted_before = False
        for attempt in range(1, attempts + 1):
            rid = f"warden-{uuid.uuid4().hex}"
            attempt_body = dict(body)
            if tag:
                xargs = dict(body.get("vllm_xargs") or {})
                xargs.update({RID_ARG: rid, ATTEMPT_ARG: attempt})
                attempt_body["vllm_xargs"] = xargs
            if attempt > 1:
                if isinstance(original_seed, int):
                    attempt_body["seed"] = original_seed + attempt - 1
                if preempted_before and vllm_compat.uses_priority_scheduling(control.engine_client):
                    base = original_priority if isinstance(original_priority, int) else 0
                    attempt_body["priority"] = base - settings.retry.priority_boost
            payload = json.dumps(attempt_body).encode()
            sub_scope = dict(scope)
            sub_scope["headers"] = [
                (k, v)
                for k, v in scope.get("headers", [])
                if k.lower() not in (b"content-length", b"x-request-id")
            ] + [(b"content-length", str(len(payload)).encode()), (b"x-request-id", rid.encode())]
            last = attempt == attempts
            if stream:
                reason = await self._stream_attempt(sub_scope, receive, send, payload, rid, last)
            else:
                reason = await self._buffered_attempt(sub_scope, receive, send, payload, rid, last)
            if reason is None:
                return
            preempted_before = preempted_before or reason == "warden_preemption"
            if last:
                return
            control.retries.labels(reason).inc()
            with telemetry.tracer().start_as_current_span("warden.retry") as span:
                span.set_attribute("warden.reason", reason)
                span.set_attribute("warden.attempt", attempt + 1)
            await asyncio.sleep(backoff_s(settings.retry, attempt + 1, random.Random()))

    async def _failure(self, status: int, body: bytes, rid: str) -> str | None:
        # A success may still carry a poisoned last token: wait (boundedly) for its flag.
        wait_s = flag_wait.configured_wait_s() if status < 400 else 0.0
        nonfinite = await flag_wait.nonfinite_flag(self.board, rid, wait_s) is not None
        return classify_failure(status, body, self.control.was_preempted(rid), nonfinite)

    async def _exhausted(self, send: Send, reason: str, sent_start: bool) -> None:
        self.control.retries_exhausted.labels(reason).inc()
        retry_after = self.control.policy().retry_after_s
        if reason == "nonfinite_logits":
            status, message = 500, "the model produced non-finite logits (NaN/Inf) on every try"
        else:
            status, message = 503, f"request failed after retries ({reason})"
        if not sent_start:
            headers = [(b"retry-after", str(retry_after).encode())] if status == 503 else []
            await self._reply(
                send, status, _error_body(message, "server_error", status, reason), headers
            )

    async def _buffered_attempt(
        self, scope: Scope, receive: Receive, send: Send, payload: bytes, rid: str, last: bool
    ) -> str | None:
        """Run one non-streaming attempt; return the retry reason, or None once answered."""
        start: Message = {}
        chunks: list[bytes] = []

        async def collect(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, replay_body(payload, receive), collect)
        status = int(start.get("status", 500))
        data = b"".join(chunks)
        reason = await self._failure(status, data, rid)
        if reason is not None and reason in TRANSIENT_REASONS:
            if last:
                await self._exhausted(send, reason, sent_start=False)
                return reason
            return reason
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        self.requests.labels(outcome_of(status)).inc()
        return None

    async def _stream_attempt(
        self, scope: Scope, receive: Receive, send: Send, payload: bytes, rid: str, last: bool
    ) -> str | None:
        """Run one streaming attempt: retryable until its first byte reaches the client."""
        held: Message = {}
        state: dict[str, Any] = {"started": False, "abandoned": None, "status": 500}

        async def forward(message: Message) -> None:
            if state["abandoned"] is not None:
                return  # this attempt is being retried: swallow the rest
            if message["type"] == "http.response.start":
                held.update(message)
                state["status"] = int(message.get("status", 500))
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            if not state["started"]:
                if not chunk and more:
                    return
                reason = await self._failure(state["status"], chunk, rid)
                if reason is not None and not last:
                    state["abandoned"] = reason
                    return
                state["started"] = True
                await send(held)
            elif b"data: [DONE]" in chunk:
                reason = await self._failure(state["status"], b"", rid)
                if reason is not None:
                    self.control.retries_exhausted.labels(reason).inc()
                    event = {
                        "error": {
                            "message": f"stream aborted by warden: {reason}",
                            "type": "server_error",
                            "code": 500,
                            "warden_reason": reason,
                        }
                    }
                    chunk = f"data: {json.dumps(event)}\n\n".encode() + chunk
            await send({"type": "http.response.body", "body": chunk, "more_body": more})

        await self.app(scope, replay_body(payload, receive), forward)
        if state["abandoned"] is not None:
            return str(state["abandoned"])
        if not state["started"]:
            # The stream ended without a byte: answer with what we held.
            reason = await self._failure(state["status"], b"", rid)
            if reason is not None and last:
                await self._exhausted(send, reason, sent_start=False)
                return None
            if held:
                await send(held)
                await send({"type": "http.response.body", "body": b""})
        self.requests.labels(outcome_of(int(state["status"]))).inc()
        return None
