"""ASGI middleware in vLLM's API server: admission control and transparent retries.

Every request that can start work passes admission (``warden.engine.routes``: all methods but
GET/HEAD/OPTIONS, on every route but an explicit allow-list, ``--root-path`` handled as the
router does). In order, each step before any work the next one needs:
1. a request vLLM's own API-key check will refuse is handed to it untouched (401; no work here);
2. the policy's refusals (503/429 with Retry-After and an OpenAI-style error naming the
   reason), from headers alone: priority comes from trusted sources only
   (``warden.control.trust``);
3. the body, bounded (413 on Content-Length, else while it streams) and parsed to a 4xx on
   any malformed input, only for routes whose JSON carries a token limit;
4. the cap, written where vLLM reads it and only ever lowering it, bounding the request's
   total (``n`` x prompts sequences; ``warden.control.token_limits``); a limiting field warden
   cannot read is refused (400) while a cap is in force, never forwarded; then the KV
   forecast (tokenized off the event loop);
5. for completions, chat completions and responses: a tag (``X-Request-Id``,
   ``vllm_xargs.warden_rid``) and retries of transient failures (warden preemption, OOM-class
   errors, non-finite logits, timeouts) with backoff and jitter: non-streaming ones
   transparently, streaming ones only before their first byte, else the stream ends with an
   error event. Every final outcome is counted in ``warden_requests_total{outcome}``.
Exempt routes that still work on the body (tokenize, count, render) are bounded in size too,
and closed under ``reject_all``. Pure ASGI: streams stay streams.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from exporter import catalog, vllm_compat
from exporter.catalog import LEASE_SOURCES
from exporter.metrics import process_metrics
from exporter.request_args import ATTEMPT_ARG, RID_ARG
from exporter.settings import load_settings
from exporter.signals import SignalBoard
from exporter.step_monitor import process_monitor
from warden.common.jsonbody import BadRequest, content_length, lax_bool, load_json
from warden.control import telemetry, token_limits, trust
from warden.control.admission import (
    Decision,
    HalfOpenGate,
    KvState,
    RequestFacts,
    admit_exempt,
    token_ceiling,
)
from warden.control.leases import DRAIN_LEASE_KEY
from warden.control.policy import EffectivePolicy
from warden.control.retry import (
    ALL_TOKENS_MASKED,
    ALL_TOKENS_MASKED_MESSAGE,
    TRANSIENT_REASONS,
    backoff_s,
    classify_failure,
)
from warden.control.token_limits import Limit, Unreadable
from warden.engine import flag_wait, routes, runtime

_ALERTMANAGER, _REFLEX, MANUAL = LEASE_SOURCES  # the supervisor's drain is a manual lease

log = logging.getLogger("warden.control")
# Routes whose requests warden tags and retries; the responses API takes no vllm_xargs.
RETRIED_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
TAGGED_ROUTES = ("/v1/completions", "/v1/chat/completions")
# Prompts longer than this are not tokenized for the forecast (vLLM refuses them anyway).
MAX_FORECAST_PROMPT_CHARS = 1 << 20
WEBSOCKET_TRY_AGAIN_LATER = 1013

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


def _error_body(
    message: str, kind: str, code: int, reason: str, extra: dict[str, Any] | None = None
) -> bytes:
    error = {"message": message, "type": kind, "param": None, "code": code, "warden_reason": reason}
    return json.dumps({"error": {**error, **(extra or {})}}).encode()


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _prompt_text(route: str, body: dict[str, Any]) -> str | list[int] | None:
    if route == token_limits.INVOCATIONS:
        chat = isinstance(body.get("messages"), list)
        route = "/v1/chat/completions" if chat else "/v1/completions"
    if route == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return prompt
        return None
    messages = body.get("messages") if route == "/v1/chat/completions" else None
    if isinstance(messages, list):
        parts = [m.get("content") for m in messages if isinstance(m, dict)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return None


def _with_body(scope: Scope, payload: bytes, request_id: str | None = None) -> Scope:
    """A copy of ``scope`` whose Content-Length (and X-Request-Id) match what vLLM gets."""
    replaced = (b"content-length", b"x-request-id") if request_id else (b"content-length",)
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in replaced]
    headers.append((b"content-length", str(len(payload)).encode()))
    if request_id:
        headers.append((b"x-request-id", request_id.encode()))
    return {**scope, "headers": headers}


class BodyTooLarge(Exception):
    """The request body passed the configured limit."""


class WardenMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app
        # Builds the controller now: an invalid config stops the server at start.
        self.control = runtime.controller()
        self.requests = process_metrics().get(catalog.REQUESTS)
        self.gate = HalfOpenGate()
        self._board: SignalBoard | None = None
        # Read once: parsing the settings costs about a millisecond, too much per request.
        self._board_path = load_settings().signal_board
        self._tokenizer: Any = None
        self._vllm_auth: Any = False  # False: not looked up yet; None: vLLM has no API key

    # --- plumbing ---------------------------------------------------------------------

    @property
    def board(self) -> SignalBoard | None:
        if self._board is None:
            path = self._board_path
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

    async def _bad_request(self, send: Send, status: int, message: str) -> None:
        """Malformed input: the client's to fix, so not a refusal (no Retry-After)."""
        reason = "too_large" if status == 413 else "bad_request"
        await self._reply(
            send, status, _error_body(message, "invalid_request_error", status, reason)
        )

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, decision: Decision) -> None:
        """The one place a refusal is answered, from its Decision (signal, value, Retry-After)."""
        self.control.record_rejection(decision)
        with telemetry.tracer().start_as_current_span("warden.reject") as span:
            span.set_attribute("warden.reason", decision.reason)
            span.set_attribute("warden.status", decision.status)
        if scope.get("type") == "websocket":
            await receive()  # websocket.connect; closing before accepting answers 403
            await send(
                {
                    "type": "websocket.close",
                    "code": WEBSOCKET_TRY_AGAIN_LATER,
                    "reason": f"{decision.reason}: {decision.message}"[:120],
                }
            )
            self.requests.labels(outcome_of(decision.status)).inc()
            return
        kind = "invalid_request_error" if decision.status == 400 else "server_overloaded"
        headers = decision.retry_after_headers()
        if decision.signal == MANUAL and decision.value == DRAIN_LEASE_KEY:
            # Draining for a restart: this server goes away soon, so the client must not keep
            # the connection for its next request (it would be reset under it).
            headers.append((b"connection", b"close"))
        body = _error_body(
            decision.message, kind, decision.status, decision.reason, decision.error_fields()
        )
        await self._reply(send, decision.status, body, headers)

    def _vllm_refuses_credentials(self, scope: Scope) -> bool:
        """Whether vLLM's own API-key check (inside this middleware) will answer 401.

        vLLM adds its check before warden's middleware, so warden runs first; a request it
        will refuse anyway must cost warden nothing (no body read, no decision).
        """
        if self._vllm_auth is False:
            self._vllm_auth = None
            try:
                from vllm import envs
                from vllm.entrypoints.serve.middleware.authenticate import (
                    GUARDED_PREFIX,
                    AuthenticationMiddleware,
                )

                args = getattr(getattr(scope.get("app"), "state", None), "args", None)
                keys = [k for k in (getattr(args, "api_key", None) or [envs.VLLM_API_KEY]) if k]
                if keys:
                    self._vllm_auth = (AuthenticationMiddleware(self.app, keys), GUARDED_PREFIX)
            except Exception:  # another vLLM: its check still runs, warden just runs first
                log.debug("warden: vLLM's API-key check not found", exc_info=True)
        if self._vllm_auth is None:
            return False
        from starlette.datastructures import Headers

        check, guarded = self._vllm_auth
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        return bool(path.startswith(guarded)) and not check.verify_token(Headers(scope=scope))

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body (None: the client went away); BodyTooLarge past the limit."""
        most = self.control.config.admission.max_body_bytes
        raw = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            raw.extend(message.get("body", b""))
            if len(raw) > most:
                raise BodyTooLarge
            if not message.get("more_body"):
                return bytes(raw)

    def _bounded(self, receive: Receive, state: dict[str, bool]) -> Receive:
        """A receive() that cuts the body off past the limit (the app sees a disconnect)."""
        most = self.control.config.admission.max_body_bytes
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > most:
                    state["over"] = True
                    return {"type": "http.disconnect"}
            return message

        return bounded

    async def _prompt_tokens(self, route: str, body: dict[str, Any]) -> int | None:
        prompt = _prompt_text(route, body)
        if prompt is None or len(prompt) > MAX_FORECAST_PROMPT_CHARS:
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
            # Off the event loop: a long prompt must not stall every stream and /health.
            return len(await asyncio.to_thread(self._tokenizer.encode, prompt))
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
        admitted = routes.admitted(scope)
        if (not admitted and not routes.bounded_exempt(scope)) or self._vllm_refuses_credentials(
            scope
        ):
            await self.app(scope, receive, send)
            return
        if not admitted:
            await self._exempt(scope, receive, send)
            return
        headers = _headers(scope)
        control = self.control
        settings = control.config.admission
        client = scope.get("client")
        priority = trust.request_priority(
            headers.get(settings.priority.header.lower()),
            client[0] if client else None,
            headers.get("authorization"),
            settings.priority,
        )
        policy = control.policy()
        decision = control.admit(RequestFacts(priority=priority), policy, self.gate)
        if not decision.admit:
            await self._refuse(scope, receive, send, decision)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        try:
            declared = content_length(headers.get("content-length"))
        except BadRequest as exc:
            await self._bad_request(send, 400, str(exc))
            return
        if declared is not None and declared > settings.max_body_bytes:
            await self._bad_request(send, 413, self._too_large())
            return
        route = routes.get_route_path(scope)
        if not token_limits.reads_json_body(route):
            await self._forward_bounded(scope, receive, send)
            return
        try:
            raw = await self._read_body(scope, receive)
        except BodyTooLarge:
            await self._bad_request(send, 413, self._too_large())
            return
        if raw is None:
            return
        try:
            body = load_json(raw)
        except BadRequest as exc:
            await self._bad_request(send, 400, str(exc))
            return
        if not isinstance(body, dict):
            await self._bad_request(send, 400, "body: expected a JSON object")
            return
        rule = token_limits.limit_for(route, body)
        assert rule is not None  # reads_json_body(route) said so
        try:
            requested = rule.requested(body)
            sequences = rule.sequences(body)
        except Unreadable as exc:
            if token_ceiling(policy) is None:
                # vLLM refuses this body itself (400, naming the field): nothing to cap.
                await self._forward_raw(scope, receive, send, raw)
                return
            # Fail closed: a limit warden cannot read is never forwarded under a cap.
            await self._bad_request(send, 400, f"{exc} (output is capped: it must be readable)")
            return
        facts = RequestFacts(priority=priority, max_tokens=requested, sequences=sequences)
        await self._handle(scope, receive, send, route, raw, body, rule, policy, facts)

    async def _exempt(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An exempt route that still works on the body (tokenize, count, render): closed
        under ``reject_all``, its body bounded like every other (not counted as a request:
        it is not one admission decides)."""
        control = self.control
        decision = admit_exempt(control.policy(), control.cause_of)
        if not decision.admit:
            await self._refuse(scope, receive, send, decision)
            return
        try:
            declared = content_length(_headers(scope).get("content-length"))
        except BadRequest as exc:
            await self._bad_request(send, 400, str(exc))
            return
        if declared is not None and declared > control.config.admission.max_body_bytes:
            await self._bad_request(send, 413, self._too_large())
            return
        await self._forward_bounded(scope, receive, send, count=False)

    def _too_large(self) -> str:
        most = self.control.config.admission.max_body_bytes
        return f"request body too large (limit {most} bytes)"

    async def _forward_bounded(
        self, scope: Scope, receive: Receive, send: Send, count: bool = True
    ) -> None:
        """Pass a request whose body warden does not read, its size still bounded."""
        state = {"over": False, "started": False}
        status = {"code": 500}

        async def watch(message: Message) -> None:
            if state["over"]:
                return  # the app is answering a body we cut off; 413 follows
            if message["type"] == "http.response.start":
                state["started"] = True
                status["code"] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, self._bounded(receive, state), watch)
        except Exception:
            if not state["over"]:
                raise
        if state["over"]:
            if not state["started"]:
                await self._bad_request(send, 413, self._too_large())
            return
        if count:
            self.requests.labels(outcome_of(status["code"])).inc()

    async def _forward_raw(self, scope: Scope, receive: Receive, send: Send, raw: bytes) -> None:
        status = {"code": 500}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        await self.app(scope, replay_body(raw, receive), watch)
        self.requests.labels(outcome_of(status["code"])).inc()

    async def _handle(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: str,
        raw: bytes,
        body: dict[str, Any],
        rule: Limit,
        policy: EffectivePolicy,
        facts: RequestFacts,
    ) -> None:
        """An admitted request with its body: the cap and the forecast, then vLLM."""
        control = self.control
        settings = control.config
        kv = None
        if settings.admission.forecast.enabled:
            kv = self._kv_state()
            if kv is not None:
                prompt_tokens = await self._prompt_tokens(route, body)
                facts = dataclasses.replace(facts, prompt_tokens=prompt_tokens)
        decision = control.limit(facts, policy, kv)
        if not decision.admit:
            await self._refuse(scope, receive, send, decision)
            return
        # Counted in flight until answered: admission judges the queue from it (live_saturation).
        with control.serving():
            if decision.cap is not None:
                control.capped.inc()
                rule.write_cap(body, decision.cap)
            if route not in RETRIED_ROUTES:
                # Under a cap vLLM gets the body warden read, re-encoded: no spelling (a key
                # given twice, say) can mean one thing to warden and another to vLLM.
                capped = token_ceiling(policy) is not None
                payload = json.dumps(body).encode() if capped else raw
                await self._forward_raw(_with_body(scope, payload), receive, send, payload)
                return
            try:
                stream = bool(lax_bool(body.get("stream")))
            except BadRequest:
                stream = False  # vLLM refuses it (400)
            xargs = body.get("vllm_xargs")
            tag = route in TAGGED_ROUTES and (xargs is None or isinstance(xargs, dict))
            attempts = settings.retry.max_attempts
            original_seed = body.get("seed")
            original_priority = body.get("priority")
            preempted_before = False
            for attempt in range(1, attempts + 1):
                rid = f"warden-{uuid.uuid4().hex}"
                attempt_body = dict(body)
                if tag:
                    attempt_xargs = dict(xargs or {})
                    attempt_xargs.update({RID_ARG: rid, ATTEMPT_ARG: attempt})
                    attempt_body["vllm_xargs"] = attempt_xargs
                if attempt > 1:
                    if isinstance(original_seed, int) and not isinstance(original_seed, bool):
                        attempt_body["seed"] = original_seed + attempt - 1
                    if preempted_before and vllm_compat.uses_priority_scheduling(
                        control.engine_client
                    ):
                        base = original_priority if isinstance(original_priority, int) else 0
                        attempt_body["priority"] = base - settings.retry.priority_boost
                payload = json.dumps(attempt_body).encode()
                sub_scope = _with_body(scope, payload, rid)
                last = attempt == attempts
                if stream:
                    reason = await self._stream_attempt(
                        sub_scope, receive, send, payload, rid, last
                    )
                else:
                    reason = await self._buffered_attempt(
                        sub_scope, receive, send, payload, rid, last
                    )
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
        flag = await flag_wait.nonfinite_flag(self.board, rid, wait_s)
        if flag == "masked":
            return ALL_TOKENS_MASKED
        return classify_failure(status, body, self.control.was_preempted(rid), flag is not None)

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
        if reason == ALL_TOKENS_MASKED:
            body = _error_body(ALL_TOKENS_MASKED_MESSAGE, "BadRequestError", 400, reason)
            await self._reply(send, 400, body)
            return None
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
                if reason in TRANSIENT_REASONS and not last:
                    state["abandoned"] = reason
                    return
                state["started"] = True
                await send(held)
            elif b"data: [DONE]" in chunk:
                reason = await self._failure(state["status"], b"", rid)
                if reason is not None:
                    masked = reason == ALL_TOKENS_MASKED
                    if not masked:
                        self.control.retries_exhausted.labels(reason).inc()
                    event = {
                        "error": {
                            "message": ALL_TOKENS_MASKED_MESSAGE
                            if masked
                            else f"stream aborted by warden: {reason}",
                            "type": "BadRequestError" if masked else "server_error",
                            "code": 400 if masked else 500,
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
            if reason in TRANSIENT_REASONS and last:
                await self._exhausted(send, reason, sent_start=False)
                return None
            if held:
                await send(held)
                await send({"type": "http.response.body", "body": b""})
        self.requests.labels(outcome_of(int(state["status"]))).inc()
        return None
