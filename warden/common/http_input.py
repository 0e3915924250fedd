"""One guarded HTTP input: every route of warden's that reads a request body reads it here.

A body from an untrusted client is read so that bad input is a clear 4xx, never a 500 and
never a stall: the content type checked first where the route takes only JSON (415), the
declared Content-Length before a byte is read (400 when malformed, too large when over the
limit), then the bytes counted while they stream, cut off past the limit. The admission
middleware (ASGI), the webhook and override routes and the relay (Starlette requests) and the
supervisor's control port (``http.server``) all apply the same ``BodyRules``.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from warden.common.jsonbody import BadRequest, content_length, load_json

JSON = "application/json"
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]


class InputRefused(BadRequest):
    """The body is refused before anything acts on it; ``status`` is the 4xx to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def reason(self) -> str:
        return "too_large" if self.status == 413 else "bad_request"


@dataclass(frozen=True)
class BodyRules:
    """What one route accepts: at most ``max_bytes``, JSON only or any type. A body over the
    limit is answered ``too_large_status``: 413, or 400 where the caller is Alertmanager (it
    retries neither, and its docs name 400 for a bad notification)."""

    max_bytes: int
    json_only: bool = False
    too_large_status: int = 413

    def too_large(self) -> InputRefused:
        return InputRefused(
            self.too_large_status, f"request body too large (limit {self.max_bytes} bytes)"
        )

    def check_head(self, content_type: str | None, declared: str | None) -> int | None:
        """Refuse from the headers alone; the declared length (None: not given)."""
        if self.json_only:
            given = content_type or ""
            if given.split(";")[0].strip().lower() != JSON:
                raise InputRefused(415, f"content type must be {JSON}, got {given!r}")
        try:
            length = content_length(declared)
        except BadRequest as exc:
            raise InputRefused(400, str(exc)) from None
        if length is not None and length > self.max_bytes:
            raise self.too_large()
        return length

    async def read(self, chunks: AsyncIterable[bytes]) -> bytes:
        """The whole body of a stream of chunks, cut off past the limit."""
        body = bytearray()
        async for chunk in chunks:
            body.extend(chunk)
            if len(body) > self.max_bytes:
                raise self.too_large()
        return bytes(body)

    async def read_asgi(self, receive: Receive) -> bytes | None:
        """The whole body from an ASGI ``receive`` (None: the client went away)."""
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        first = message.get("body", b"")
        if len(first) > self.max_bytes:
            raise self.too_large()
        if not message.get("more_body"):
            return first  # the common case: one message, no copy
        body = bytearray(first)
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body.extend(message.get("body", b""))
            if len(body) > self.max_bytes:
                raise self.too_large()
            if not message.get("more_body"):
                return bytes(body)

    def bounded(self, receive: Receive, over: Callable[[], None]) -> Receive:
        """An ASGI ``receive`` for a body passed on unread: past the limit, ``over()`` is
        called and the app sees the client go away."""
        most = self.max_bytes
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > most:
                    over()
                    return {"type": "http.disconnect"}
            return message

        return bounded


class Request(Protocol):
    """What is read of a request: Starlette's ``Request`` has both."""

    @property
    def headers(self) -> Any: ...

    def stream(self) -> AsyncIterable[bytes]: ...


async def read_request(rules: BodyRules, request: Request) -> bytes:
    """Check the head, then read the body; ``InputRefused`` with the 4xx to answer."""
    headers = request.headers
    rules.check_head(headers.get("content-type"), headers.get("content-length"))
    return await rules.read(request.stream())


async def read_json(rules: BodyRules, request: Request) -> Any:
    """``read_request``, then the body parsed (``InputRefused`` 400 when malformed)."""
    raw = await read_request(rules, request)
    try:
        return load_json(raw)
    except BadRequest as exc:
        raise InputRefused(400, str(exc)) from None
