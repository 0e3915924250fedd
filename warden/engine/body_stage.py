"""Body handling for admitted requests: bounded, parsed, capped and forecast, then passed on.

The body is bounded (413 on Content-Length, else while it streams: ``warden.common.http_input``)
and parsed to a 4xx on any malformed input, only for routes whose JSON carries a token limit;
other bodies pass unread, still bounded. Then the cap, written where vLLM reads it and only ever
lowering it, bounding the request's total (``n`` x prompts sequences;
``warden.control.token_limits``): a limiting field warden cannot read is refused (400) while a
cap is in force, never forwarded. Then the KV forecast (``warden.engine.forecast``) and the
decision with the body, saturation's included: the body's hash tells a refused client's return
from a new arrival (``warden.control.saturation.RetrySchedule``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from warden.common.http_input import BodyRules, InputRefused
from warden.common.jsonbody import BadRequest, load_json
from warden.control import token_limits
from warden.control.admission import RequestFacts, token_ceiling
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
from warden.engine.forecast import Forecast, deciding_blocks
from warden.engine.retry_stage import RETRIED_ROUTES, RetryStage
from warden.engine.runtime import EngineRuntime

log = logging.getLogger("warden.control")
CONTENT_LENGTH = b"content-length"


class BodyStage:
    def __init__(
        self,
        app: App,
        rt: EngineRuntime,
        answers: Answers,
        door: AdmissionStage,
        retry: RetryStage,
    ) -> None:
        self.app = app
        self.control = control = rt.control
        self.answers = answers
        self.door = door
        self.retry = retry
        self.rules = BodyRules(control.config.admission.max_body_bytes)
        self.forecast = Forecast(rt)

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
        request_key = None
        if self.control.config.admission.saturation.enabled:
            # The same bytes back are a refused client's return; saturation is judged first,
            # so a refusal at overload costs no parsing and no token count.
            request_key = hash(raw)
            decision = self.control.judge_saturation(request_key)
            if not decision.admit:
                await self.door.refuse(scope, receive, send, decision)
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
        facts = RequestFacts(
            priority=admitted.priority,
            max_tokens=requested,
            sequences=sequences,
            request_key=request_key,
        )
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
        admission = control.config.admission
        if admission.forecast.enabled:
            kv = self.forecast.kv_state()
            if kv is not None:
                margin = admission.forecast.safety_margin_blocks
                room = deciding_blocks(kv, margin, admission.saturation.enabled)
                prompt_tokens = await self.forecast.prompt_tokens(route, body, kv, room)
                facts = dataclasses.replace(facts, prompt_tokens=prompt_tokens)
        decision = control.limit(facts, policy, kv)
        if not decision.admit:
            await self.door.refuse(scope, receive, send, decision)
            return
        # Counted in flight until answered: admission judges the queue from it (live_saturation).
        with control.serving(facts.request_key, decision.deep):
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
