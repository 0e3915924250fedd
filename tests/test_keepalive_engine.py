"""The engine's API server keeps an idle keep-alive connection longer than common clients do.

vLLM's server closes an idle connection after 5 s by default; clients such as aiohttp keep one
for 60 s, so a request sent just as the server closes the connection is lost ("Server
disconnected"). Under warden the server waits longer (warden/engine/launch.py
``HTTP_KEEP_ALIVE_S``), so the client, not the server, closes first."""

from __future__ import annotations

import http.client
import json
import time

import pytest

from warden.engine.launch import HTTP_KEEP_ALIVE_S
from warden.supervisor.engine import EngineProcess

pytestmark = pytest.mark.engine

# Longer than vLLM's own default (5 s), which would have closed the connection by then.
IDLE_S = 8.0


def test_an_idle_keep_alive_connection_outlives_vllms_default(
    plain_engine: EngineProcess,
) -> None:
    assert HTTP_KEEP_ALIVE_S > 60  # above aiohttp's 60 s
    connection = http.client.HTTPConnection("127.0.0.1", plain_engine.spec.port, timeout=120)
    body = json.dumps({"model": str(plain_engine.spec.model), "prompt": "hi", "max_tokens": 2})
    headers = {"Content-Type": "application/json"}
    try:
        connection.request("POST", "/v1/completions", body=body, headers=headers)
        first = connection.getresponse()
        first.read()
        assert first.status == 200
        first_socket = connection.sock
        time.sleep(IDLE_S)
        connection.request("POST", "/v1/completions", body=body, headers=headers)
        second = connection.getresponse()
        second.read()
        assert second.status == 200
        assert connection.sock is first_socket  # reused, not reconnected
    finally:
        connection.close()
