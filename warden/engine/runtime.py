"""The process-wide Controller of an API server, created on first use.

The middleware asks for it when vLLM builds the app, so an invalid config stops the server at
start with the field named; the endpoint plugin then hands it the engine client and attaches
the reflex to the exporter's step monitor.
"""

from __future__ import annotations

import threading

from exporter.metrics import process_metrics
from warden.control.config import load_config
from warden.control.controller import Controller

_controller: Controller | None = None
_lock = threading.Lock()


def controller() -> Controller:
    global _controller
    with _lock:
        if _controller is None:
            _controller = Controller(load_config(), process_metrics())
        return _controller
