"""Body handling for admitted requests: bounded, parsed, capped and forecast, then passed on.

The body is bounded (413 on Content-Length, else while it streams: ``warden.common.http_input``)
and parsed to a 4xx on any malformed input, only for routes whose JSON carries a token limit;
other bodies pass unread, still bounded. Then the cap, written where vLLM reads it and only ever
lowering it, bounding the request's total (``n`` x prompts sequences;
``warden.control.token_limits``): a limiting field warden cannot read is refused (400) while a
cap is in force, never forwarded. Then the KV forecast (the prompt tokenized, off the event loop
when it is long) and the decision with the body.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
from typing import Any

from exporter import vllm_compat
from exporter.step_monitor import process_monitor
from warden.common.http_input import BodyRules, InputRefused
from warden.common.jsonbody import BadRequest, load_json
from warden.control import token_limits
from warden.control.admission import KvState, RequestFacts, token_ceiling
from warden.control.controller import Controller
from warden.control.token_limits import Limit, Unreadable
from warden.engine.admission_stage import AdmissionStage, Admitted
from warden.engine.asgi import (
    Answers,
    App,
    Message,
    Receive,
    Scope,
    Send,
    forward_counted,
    replay_body,
    with_body,
)
from warden.engine.retry_stage import RETRIED_ROUTES, RetryStage

log = logging.getLogger("warden.control")
# Prompts longer than this are not tokenized for the forecast (vLLM refuses them anyway).
MAX_FORECAST_PROMPT_CHARS = 1 << 20
# Prompts up to this long are tokenized on the event loop: a thread hop costs more than they.
INLINE_TOKENIZE_CHARS = 2048
CONTENT_LENGTH = b"content-length"


def prompt_text(route: str, body: dict[str, Any]) -> str | list[int] | None:
    """The prompt the forecast counts: a completion's, or a chat's message contents."""
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


def count_tokens(tokenizer: Any, prompt: str) -> int:
    """What ``len(tokenizer.encode(prompt))`` counts. A Hugging Face fast tokenizer's Rust
    backend is asked directly when no truncation or padding is left set on it (a call of
    vLLM's may leave one, which ``encode`` would reset first): the same tokens, without the
    batch path (a thread-pool hop per prompt) and its Python wrapping."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        return len(backend.encode(prompt).ids)
    return len(tokenizer.encode(prompt))


class BodyStage:
    def __init__(
        self,
        app: App,
        control: Controller,
        answers: Answers,
        door: AdmissionStage,
        retry: RetryStage,
    ) -> None:
        self.app = app
        self.control = control
        self.answers = answers
        self.door = door
        self.retry = retry
        self.rules = BodyRules(control.config.admission.max_body_bytes)
        self._tokenizer: Any = None

    def check_head(self, headers: dict[bytes, str]) -> None:
        """``InputRefused`` from the declared length alone (before a byte is read)."""
        self.rules.check_head(None, headers.get(CONTENT_LENGTH))

    async def forward_bounded(
        self, scope: Scope, receive: Receive, send: Send, count: bool = True
    ) -> None:
        """Pass a request whose body warden does not read, its size still bounded."""
        over = False
        started = False
        status = 500

        def cut() -> None:
            nonlocal over
            over = True

        async def watch(message: Message) -> None:
            nonlocal started, status
            if over:
                return  # the app is answering a body we cut off; 413 follows
            if message["type"] == "http.response.start":
                started = True
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, self.rules.bounded(receive, cut), watch)
        except Exception:
            if not over:
                raise
        if over:
            if not started:
                await self.answers.bad_request(send, 413, str(self.rules.too_large()))
            return
        if count:
            self.answers.count(status)

    async def handle(
        self, scope: Scope, receive: Receive, send: Send, route: str, admitted: Admitted
    ) -> None:
        """An admitted request on a route whose JSON carries a token limit."""
        try:
            raw = await self.rules.read_asgi(receive)
        except InputRefused as exc:
            await self.answers.bad_request(send, exc.status, str(exc))
            return
        if raw is None:
            return
        try:
            body = load_json(raw)
        except BadRequest as exc:
            await self.answers.bad_request(send, 400, str(exc))
            return
        if not isinstance(body, dict):
            await self.answers.bad_request(send, 400, "body: expected a JSON object")
            return
        rule = token_limits.limit_for(route, body)
        assert rule is not None  # reads_json_body(route) said so
        policy = admitted.policy
        try:
            requested = rule.requested(body)
            sequences = rule.sequences(body)
        except Unreadable as exc:
            if token_ceiling(policy) is None:
                # vLLM refuses this body itself (400, naming the field): nothing to cap.
                await forward_counted(
                    self.app, self.answers, scope, replay_body(raw, receive), send
                )
                return
            # Fail closed: a limit warden cannot read is never forwarded under a cap.
            await self.answers.bad_request(
                send, 400, f"{exc} (output is capped: it must be readable)"
            )
            return
        facts = RequestFacts(priority=admitted.priority, max_tokens=requested, sequences=sequences)
        await self._decide_and_pass(scope, receive, send, route, raw, body, rule, admitted, facts)

    async def _decide_and_pass(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: str,
        raw: bytes,
        body: dict[str, Any],
        rule: Limit,
        admitted: Admitted,
        facts: RequestFacts,
    ) -> None:
        """The cap and the forecast, then vLLM (through the retry stage where it applies)."""
        control = self.control
        policy = admitted.policy
        kv = None
        if control.config.admission.forecast.enabled:
            kv = self._kv_state()
            if kv is not None:
                prompt_tokens = await self._prompt_tokens(route, body)
                facts = dataclasses.replace(facts, prompt_tokens=prompt_tokens)
        decision = control.limit(facts, policy, kv)
        if not decision.admit:
            await self.door.refuse(scope, receive, send, decision)
            return
        # Counted in flight until answered: admission judges the queue from it (live_saturation).
        with control.serving():
            changed = decision.cap is not None
            if decision.cap is not None:
                control.capped.inc()
                rule.write_cap(body, decision.cap)
            if route in RETRIED_ROUTES:
                await self.retry.run(scope, receive, send, route, raw, body, changed)
                return
            # Under a cap vLLM gets the body warden read, re-encoded: no spelling (a key given
            # twice, say) can mean one thing to warden and another to vLLM.
            payload = json.dumps(body).encode() if token_ceiling(policy) is not None else raw
            await forward_counted(
                self.app,
                self.answers,
                with_body(scope, payload),
                replay_body(payload, receive),
                send,
            )

    async def _prompt_tokens(self, route: str, body: dict[str, Any]) -> int | None:
        prompt = prompt_text(route, body)
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
            if len(prompt) <= INLINE_TOKENIZE_CHARS:
                return count_tokens(self._tokenizer, prompt)
            # Off the event loop: a long prompt must not stall every stream and /health.
            return await asyncio.to_thread(count_tokens, self._tokenizer, prompt)
        except Exception:
            log.debug("warden: prompt not tokenized; forecast skipped", exc_info=True)
            return None

    def _kv_state(self) -> KvState | None:
        geometry = vllm_compat.kv_geometry(self.control.engine_client)
        monitor = process_monitor()
        if geometry is None or monitor is None:
            return None
        return KvState(geometry[0], geometry[1], monitor.snapshot.kv_cache_usage)
