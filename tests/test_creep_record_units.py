"""The creep scenario's record of the engine: the watermark transitions and policy changes the
engine reports are kept after the engine goes away, whatever the scenario's main loop does
meanwhile (the restart after a critical crossing can come within a second or two)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from warden.cli.creep_scenario import EngineRecord


class _Engine:
    """A /warden/state that changes while it runs, then stops answering."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"watermark_transitions": [], "policy_changes": []}
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = json.dumps(engine.state).encode()
                self.send_response(200 if self.path == "/warden/state" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def gone(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine() -> Iterator[_Engine]:
    served = _Engine()
    yield served
    served.gone()


def _until(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.02)


def test_what_the_engine_recorded_is_kept_after_it_goes_away(engine: _Engine) -> None:
    high = {"at": 10.0, "level": "high", "signal": "host", "value": 0.81}
    critical = {"at": 12.0, "level": "critical", "signal": "host", "value": 0.91}
    reflex = {"at": 12.001, "active": ["stop_admission"]}
    with EngineRecord(engine.url, every_s=0.05) as record:
        engine.state = {"watermark_transitions": [high], "policy_changes": []}
        _until(lambda: record.transitions() == [high])
        engine.state = {"watermark_transitions": [high, critical], "policy_changes": [reflex]}
        _until(lambda: record.policy_changes() == [reflex])
        engine.gone()  # the restart: the engine and its record go
        time.sleep(0.3)  # reads fail meanwhile
        assert record.transitions() == [high, critical]
        assert record.policy_changes() == [reflex]


def test_a_stopped_record_keeps_what_it_had_and_reads_no_more(engine: _Engine) -> None:
    old = {"at": 10.0, "level": "critical", "signal": "host", "value": 0.95}
    engine.state = {"watermark_transitions": [old], "policy_changes": []}
    record = EngineRecord(engine.url, every_s=0.05)
    with record:
        _until(lambda: record.transitions() == [old])
        record.stop()
        # The engine after a restart is another one: nothing of it is mixed in.
        engine.state = {
            "watermark_transitions": [{"at": 20.0, "level": "high", "signal": "host"}],
            "policy_changes": [{"at": 20.0, "active": ["stop_admission"]}],
        }
        time.sleep(0.3)
        assert record.transitions() == [old]
        assert record.policy_changes() == []
