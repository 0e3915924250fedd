"""ASGI plumbing the middleware's stages share: types, answers, body replay, header rewrite.

Every answer warden writes itself goes through ``Answers``, which counts its outcome in
``warden_requests_total{outcome}`` (the label children looked up once, not per request).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from exporter import catalog

Scope = dict[str, Any]
Message = dict[str, Any]
Send = Callable[[Message], Awaitable[None]]
Receive = Callable[[], Awaitable[Message]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def outcome_of(status: int) -> str:
    if status < 400:
        return "success"
    if status in (429, 503):
        return "rejected"
    return "client_error" if status < 500 else "server_error"


def error_body(
    message: str, kind: str, code: int, reason: str, extra: dict[str, Any] | None = None
) -> bytes:
    """An OpenAI-style error naming warden's reason."""
    error = {"message": message, "type": kind, "param": None, "code": code, "warden_reason": reason}
    return json.dumps({"error": {**error, **(extra or {})}}).encode()


def header_values(scope: Scope, names: frozenset[bytes]) -> dict[bytes, str]:
    """The values of the headers named (lowercase), in one pass; the last one given wins."""
    found: dict[bytes, str] = {}
    for key, value in scope.get("headers", ()):
        key = key.lower()
        if key in names:
            found[key] = value.decode("latin-1")
    return found


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


def with_body(scope: Scope, payload: bytes, request_id: str | None = None) -> Scope:
    """A copy of ``scope`` whose Content-Length (and X-Request-Id) match what vLLM gets."""
    replaced = (b"content-length", b"x-request-id") if request_id else (b"content-length",)
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in replaced]
    headers.append((b"content-length", str(len(payload)).encode()))
    if request_id:
        headers.append((b"x-request-id", request_id.encode()))
    return {**scope, "headers": headers}


class Answers:
    """Writes warden's own answers and counts every final outcome."""

    def __init__(self, requests: Any) -> None:
        self._counted = {o: requests.labels(o) for o in catalog.REQUEST_OUTCOMES}

    def count(self, status: int) -> None:
        self._counted[outcome_of(status)].inc()

    async def reply(
        self, send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        head = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *(headers or []),
        ]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})
        self.count(status)

    async def bad_request(self, send: Send, status: int, message: str) -> None:
        """Malformed input: the client's to fix, so not a refusal (no Retry-After)."""
        reason = "too_large" if status == 413 else "bad_request"
        await self.reply(send, status, error_body(message, "invalid_request_error", status, reason))


async def forward_counted(
    app: App, answers: Answers, scope: Scope, receive: Receive, send: Send
) -> None:
    """Pass a request on and count its outcome from the status the app answers."""
    status = 500

    async def watch(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        await send(message)

    await app(scope, receive, watch)
    answers.count(status)
