"""The supervisor's HTTP: its own control port, and a stand-in on the serving port.

Control port (always up while the supervisor runs; point the liveness probe here, it stays
green through engine restarts):
  GET  /supervisor/live    200 while the supervisor loop runs
  GET  /supervisor/state   phase, engine pid, circuit, eager mode, restart history
  GET  /metrics            restart counters, durations, circuit and eager gauges
  POST /supervisor/restart a manual restart (drains first)
  POST /supervisor/reset   close the restart circuit (and start the engine if it is down)
  POST /supervisor/eager   switch to --enforce-eager now (drain, restart)
  DELETE /supervisor/eager leave eager mode at the next start
  DELETE /supervisor/memory forget remembered memory creeps: restart at the usual risk again
                           (and leave eager mode the memory guard set)
POSTs and DELETEs need ``Authorization: Bearer <token>``, always: the supervisor generates a
token when none is configured (``warden.supervisor.loop``), and without one every action is
refused. Bad input (a malformed or oversized body, an unknown method) gets a 4xx and changes
nothing.

Stand-in (only while the circuit is open and no engine runs): answers the serving port so
readiness says why, liveness stays green (no container restart loop) and Prometheus still
scrapes the circuit-open metric; every other path gets 503 + Retry-After.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from exporter.supervisor_state import SupervisorState
from warden.common.http_input import BodyRules, InputRefused
from warden.common.tokens import bearer_matches
from warden.supervisor.metrics import render

log = logging.getLogger("warden.supervisor")
STAND_IN_RETRY_AFTER_S = 60
MAX_BODY_BYTES = 64 << 10  # the actions take no body; a small one is read and ignored
BODY_RULES = BodyRules(MAX_BODY_BYTES)


class SupervisorControl(Protocol):
    @property
    def token(self) -> str | None: ...

    def status(self) -> dict[str, Any]: ...

    def state_snapshot(self) -> SupervisorState: ...

    def engine_ready(self) -> bool: ...

    def request(self, action: str) -> str: ...


def _handler(control: SupervisorControl, stand_in: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "warden-supervisor"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
            return

        def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            if isinstance(body, bytes):
                data, kind = body, "text/plain; version=0.0.4; charset=utf-8"
            else:
                data, kind = json.dumps(body).encode(), "application/json"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if not control.token:
                return False  # closed by default: no token, no actions
            return bearer_matches(self.headers.get("Authorization"), control.token)

        def _drain_body(self) -> bool:
            """Read and drop the request body; answer 4xx (and close) when it is malformed."""
            if self.headers.get("Transfer-Encoding") is not None:
                self.close_connection = True
                self._send(400, {"error": "Transfer-Encoding is not accepted; send no body"})
                return False
            try:
                length = BODY_RULES.check_head(None, self.headers.get("Content-Length")) or 0
            except InputRefused as exc:
                self.close_connection = True
                self._send(exc.status, {"error": str(exc)})
                return False
            if length:
                self.rfile.read(length)
            return True

        def __getattr__(self, name: str) -> Any:
            # http.server answers a method without a do_ handler with 501; this port knows
            # its methods, so any other is the client's mistake.
            if name.startswith("do_"):
                return self._method_not_allowed
            raise AttributeError(name)

        def _method_not_allowed(self) -> None:
            self.close_connection = True
            self._send(405, {"error": f"method {self.command[:20]!r} not allowed"})

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            path = self.path.split("?", 1)[0]
            status = control.status()
            if path == "/metrics":
                self._send(200, render(control.state_snapshot(), control.engine_ready()))
            elif path in ("/supervisor/live", "/warden/live"):
                self._send(200, {"live": True, "phase": status.get("phase")})
            elif path == "/supervisor/state":
                self._send(200, status)
            elif stand_in and path == "/warden/ready":
                reason = status.get("circuit_reason", "")
                self._send(
                    503,
                    {
                        "ready": False,
                        "failing": ["supervisor_circuit", "engine"],
                        "checks": {
                            "supervisor_circuit": {"ok": False, "detail": reason},
                            "engine": {"ok": False, "detail": "engine not running"},
                        },
                    },
                )
            else:
                self._unavailable()

        def _unavailable(self) -> None:
            if not stand_in:
                self._send(404, {"error": "not found"})
                return
            status = control.status()
            self._send(
                503,
                {"error": f"engine down, restart circuit open: {status.get('circuit_reason')}"},
                {"Retry-After": str(STAND_IN_RETRY_AFTER_S)},
            )

        def _act(self, action: str) -> None:
            if stand_in:
                self._unavailable()
            elif not self._authorized():
                self._send(401, {"error": "missing or wrong bearer token"})
            else:
                self._send(202, {"accepted": action, "detail": control.request(action)})

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            if not self._drain_body():
                return
            path = self.path.split("?", 1)[0]
            actions = {
                "/supervisor/restart": "restart",
                "/supervisor/reset": "reset",
                "/supervisor/eager": "eager",
            }
            if path in actions:
                self._act(actions[path])
            else:
                self._unavailable()

        def do_DELETE(self) -> None:  # noqa: N802 - stdlib name
            if not self._drain_body():
                return
            deletions = {"/supervisor/eager": "clear_eager", "/supervisor/memory": "clear_memory"}
            path = self.path.split("?", 1)[0]
            if path in deletions:
                self._act(deletions[path])
            else:
                self._unavailable()

    return Handler


class _Server(ThreadingHTTPServer):
    """A client that leaves before its answer is written is no error of the server's: no
    traceback for it (socketserver prints one for every exception a handler raises)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipe, ConnectionReset, ...
            log.debug("warden: client %s left before its answer", client_address)
            return
        super().handle_error(request, client_address)


class HttpServer:
    """A ThreadingHTTPServer on a daemon thread; ``close`` frees the port at once."""

    def __init__(self, host: str, port: int, control: SupervisorControl, stand_in: bool) -> None:
        self.server = _Server((host, port), _handler(control, stand_in))
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(
            target=self.server.serve_forever, name=f"warden-http-{self.port}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
