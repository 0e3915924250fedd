"""Retries and replay for completions, chat completions and responses.

Each attempt is tagged (``X-Request-Id``, ``vllm_xargs.warden_rid``) so the controller can say
whether warden preempted it and the logits processor whether it went non-finite. Transient
failures (warden preemption, OOM-class errors, non-finite logits, timeouts) are retried with
backoff and jitter: non-streaming answers transparently, streams only before their first byte,
else the stream ends with an error event. Every final outcome is counted.

Cheap on the common path: the tag is spliced into the client's bytes when the body has no
``vllm_xargs`` of its own (no re-encoding), and once a stream's first byte has gone its chunks
pass through as they came, looked at only for the end-of-stream marker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from prometheus_client import Histogram

from exporter import vllm_compat
from exporter.request_args import ATTEMPT_ARG, RID_ARG
from exporter.signals import SignalBoard
from warden.common.jsonbody import BadRequest, lax_bool
from warden.control import telemetry
from warden.control.controller import Controller
from warden.control.retry import (
    ALL_TOKENS_MASKED,
    ALL_TOKENS_MASKED_MESSAGE,
    TRANSIENT_REASONS,
    backoff_s,
    classify_failure,
)
from warden.engine import flag_wait
from warden.engine.asgi import (
    Answers,
    App,
    Message,
    Receive,
    Scope,
    Send,
    error_body,
    replay_body,
    with_body,
)

log = logging.getLogger("warden.control")
# Routes whose requests warden tags and retries; the responses API takes no vllm_xargs.
RETRIED_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
TAGGED_ROUTES = ("/v1/completions", "/v1/chat/completions")
STREAM_END = b"data: [DONE]"


def spliced(raw: bytes, body: dict[str, Any], field: str, value: dict[str, Any]) -> bytes | None:
    """``raw`` with ``"field": value`` added as its last member, when that is sure to mean
    ``body`` plus the field: ``raw`` is a plain UTF-8 JSON object (no BOM, no other encoding)
    and ``body`` has no such field under any spelling. None: re-encode instead."""
    if field in body:
        return None
    text = raw.strip()
    if not (text.startswith(b"{") and text.endswith(b"}")):
        return None
    member = f'"{field}": {json.dumps(value)}'.encode()
    return text[:-1] + (b", " if body else b"") + member + b"}"


class RetryStage:
    def __init__(
        self,
        app: App,
        control: Controller,
        answers: Answers,
        board: Path | None,
        flag_waits: Histogram,
    ) -> None:
        self.app = app
        self.control = control
        self.answers = answers
        self.flag_waits = flag_waits  # the histogram of waits for a step's non-finite flag
        self._board: SignalBoard | None = None
        self._board_path = board

    @property
    def board(self) -> SignalBoard | None:
        if self._board is None:
            path = self._board_path
            if path and path.exists():
                self._board = SignalBoard(str(path))
        return self._board

    async def run(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: str,
        raw: bytes,
        body: dict[str, Any],
        changed: bool,
    ) -> None:
        """Every attempt of one admitted request (``changed``: ``body`` differs from ``raw``)."""
        control = self.control
        settings = control.config.retry
        try:
            stream = bool(lax_bool(body.get("stream")))
        except BadRequest:
            stream = False  # vLLM refuses it (400)
        xargs = body.get("vllm_xargs")
        tag = route in TAGGED_ROUTES and (xargs is None or isinstance(xargs, dict))
        attempts = settings.max_attempts
        original_seed = body.get("seed")
        original_priority = body.get("priority")
        preempted_before = False
        for attempt in range(1, attempts + 1):
            rid = f"warden-{uuid.uuid4().hex}"
            payload = None
            if attempt == 1 and not changed:
                if not tag:
                    payload = raw
                elif xargs is None:
                    payload = spliced(raw, body, "vllm_xargs", {RID_ARG: rid, ATTEMPT_ARG: 1})
            if payload is None:
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
                        attempt_body["priority"] = base - settings.priority_boost
                payload = json.dumps(attempt_body).encode()
            sub_scope = with_body(scope, payload, rid)
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
            await asyncio.sleep(backoff_s(settings, attempt + 1, random.Random()))

    async def _failure(self, status: int, body: bytes, rid: str) -> str | None:
        # A success may still carry a poisoned last token: wait (boundedly) for its flag.
        wait_s = flag_wait.configured_wait_s() if status < 400 else 0.0
        flag = await flag_wait.nonfinite_flag(self.board, rid, wait_s, self.flag_waits)
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
            await self.answers.reply(
                send, status, error_body(message, "server_error", status, reason), headers
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
            body = error_body(ALL_TOKENS_MASKED_MESSAGE, "BadRequestError", 400, reason)
            await self.answers.reply(send, 400, body)
            return None
        if reason is not None and reason in TRANSIENT_REASONS:
            if last:
                await self._exhausted(send, reason, sent_start=False)
            return reason
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        self.answers.count(status)
        return None

    async def _stream_attempt(
        self, scope: Scope, receive: Receive, send: Send, payload: bytes, rid: str, last: bool
    ) -> str | None:
        """Run one streaming attempt: retryable until its first byte reaches the client."""
        held: Message = {}
        started = False
        abandoned: str | None = None
        status = 500

        def forward(message: Message) -> Awaitable[None]:
            # Once the first byte is out (the common case, once per token), a chunk goes on as
            # it came, looked at only for the end-of-stream marker, and through no coroutine of
            # warden's: the app awaits the server's own send (``send(message)``).
            if started:
                body = message.get("body")
                if body and STREAM_END in body:
                    return self._send_end(send, message, status, rid)
                return send(message)
            return before_first_byte(message)

        async def before_first_byte(message: Message) -> None:
            nonlocal started, abandoned, status
            if abandoned is not None:
                return  # this attempt is being retried: swallow the rest
            if message["type"] == "http.response.start":
                held.update(message)
                status = int(message.get("status", 500))
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            if not chunk and more:
                return
            reason = await self._failure(status, chunk, rid)
            if reason in TRANSIENT_REASONS and not last:
                abandoned = reason
                return
            started = True
            await send(held)
            await send({"type": "http.response.body", "body": chunk, "more_body": more})

        await self.app(scope, replay_body(payload, receive), forward)
        if abandoned is not None:
            return abandoned
        if not started:
            # The stream ended without a byte: answer with what we held.
            reason = await self._failure(status, b"", rid)
            if reason in TRANSIENT_REASONS and last:
                await self._exhausted(send, reason, sent_start=False)
                return None
            if held:
                await send(held)
                await send({"type": "http.response.body", "body": b""})
        self.answers.count(status)
        return None

    async def _send_end(self, send: Send, message: Message, status: int, rid: str) -> None:
        """The chunk with the end-of-stream marker, an error event first if one is due."""
        chunk = await self._stream_end(message["body"], status, rid)
        await send({**message, "body": chunk})

    async def _stream_end(self, chunk: bytes, status: int, rid: str) -> bytes:
        """The last chunk, preceded by an error event when the stream must not count as good."""
        reason = await self._failure(status, b"", rid)
        if reason is None:
            return chunk
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
        return f"data: {json.dumps(event)}\n\n".encode() + chunk
