"""ASGI apps in tests: served for real (uvicorn, a TCP port on this machine) inside a test
process, or called in-process with one JSON request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn

from warden.common.ports import free_port
from warden.common.waiting import wait_until


@contextlib.contextmanager
def serving(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` on a free port of ``host`` until the block ends; yields its base URL."""
    port = free_port(host)
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 15, 0.02, what=f"uvicorn on {host}:{port}")
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def post_json(app: Any, body: Any, path: str = "/v1/completions") -> list[dict[str, Any]]:
    """Call ``app`` in-process with one JSON POST; the ASGI messages it sent back."""
    payload = json.dumps(body).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(b"content-type", b"application/json")],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": payload, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent
