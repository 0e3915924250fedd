"""The front door: who is refused before the body is read, and the one place refusals are answered.

In order, before any work the next step needs: a request vLLM's own API-key check will refuse
is left to it (401; no work here); then the policy's refusals (503/429 with Retry-After and an
OpenAI-style error naming the reason, the signal and its value) from headers alone, priority
from trusted sources only (``warden.control.trust``). The circuit breaker's half-open share is
let through by the controller's own gate, the breaker's one gate: every request the middleware
admits and every decision ``/warden/state`` explains count against the same credit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from exporter.catalog import LEASE_SOURCES
from warden.control import telemetry, trust
from warden.control.admission import Decision, RequestFacts, admit_exempt
from warden.control.controller import Controller
from warden.control.leases import DRAIN_LEASE_KEY
from warden.control.policy import EffectivePolicy
from warden.engine.asgi import Answers, App, Receive, Scope, Send, error_body

_ALERTMANAGER, _REFLEX, MANUAL = LEASE_SOURCES  # the supervisor's drain is a manual lease
WEBSOCKET_TRY_AGAIN_LATER = 1013
AUTHORIZATION = b"authorization"

log = logging.getLogger("warden.control")


@dataclass(frozen=True)
class Admitted:
    """What the front door learned of a request it let in."""

    priority: int
    policy: EffectivePolicy


class AdmissionStage:
    def __init__(self, app: App, control: Controller, answers: Answers) -> None:
        self.app = app
        self.control = control
        self.answers = answers
        self.priority_header = control.config.admission.priority.header.lower().encode("latin-1")
        self._vllm_auth: Any = False  # False: not looked up yet; None: vLLM has no API key

    def header_names(self) -> tuple[bytes, ...]:
        """The headers this stage reads."""
        return (self.priority_header, AUTHORIZATION)

    def vllm_refuses_credentials(self, scope: Scope) -> bool:
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

    async def admit(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[bytes, str],
        saturation_with_body: bool = False,
    ) -> Admitted | None:
        """The policy's decision before the body (and saturation's, unless the body stage
        judges it: ``saturation_with_body``); None once a refusal is answered."""
        control = self.control
        client = scope.get("client")
        priority = trust.request_priority(
            headers.get(self.priority_header),
            client[0] if client else None,
            headers.get(AUTHORIZATION),
            control.config.admission.priority,
        )
        policy = control.policy()
        decision = control.admit(
            RequestFacts(priority=priority), policy, saturation_with_body=saturation_with_body
        )
        if not decision.admit:
            await self.refuse(scope, receive, send, decision)
            return None
        return Admitted(priority, policy)

    async def admit_exempt(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """An exempt route that still works on the body (tokenize, count, render) is closed
        only under ``reject_all`` (not counted as a request: admission does not decide it)."""
        control = self.control
        decision = admit_exempt(control.policy())
        if not decision.admit:
            await self.refuse(scope, receive, send, decision)
            return False
        return True

    async def refuse(self, scope: Scope, receive: Receive, send: Send, decision: Decision) -> None:
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
            self.answers.count(decision.status)
            return
        kind = "invalid_request_error" if decision.status == 400 else "server_overloaded"
        headers = decision.retry_after_headers()
        if decision.signal == MANUAL and decision.value == DRAIN_LEASE_KEY:
            # Draining for a restart: this server goes away soon, so the client must not keep
            # the connection for its next request (it would be reset under it).
            headers.append((b"connection", b"close"))
        body = error_body(
            decision.message, kind, decision.status, decision.reason, decision.error_fields()
        )
        await self.answers.reply(send, decision.status, body, headers)
