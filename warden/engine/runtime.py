"""One API server's engine runtime: what warden's adapters share, built once and passed in.

``EngineRuntime`` holds the controller, warden's metrics, the way to the exporter's step
monitor, the webhook's guard (its token), and the link to the engine the endpoint plugin
attaches. Everything in
``warden.engine`` receives it (a constructor argument, or ``request.app.state`` for routes)
rather than reaching for a process-wide object, so a test builds its own with
``EngineRuntime.build`` (a private registry, an injected clock, a fake monitor or engine).

The composition root is ``process_runtime``, the only process-wide accessor: vLLM instantiates
warden's ASGI middleware and endpoint plugin with no arguments of warden's, and both ask it for
the one runtime of their API server. The middleware asks when vLLM builds the app, so an
invalid config stops the server at start with the field named.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.requests import Request

from exporter.metrics import WardenMetrics, process_metrics
from exporter.step_monitor import StepMonitor, process_monitor
from warden.control.config import ControlConfig, load_config
from warden.control.controller import Controller
from warden.engine.webhook_guard import WebhookGuard

STATE_KEY = "warden_runtime"


def _no_monitor() -> StepMonitor | None:
    return None


@dataclass
class EngineRuntime:
    control: Controller
    metrics: WardenMetrics
    # A source, not a value: vLLM's stat logger creates the monitor after the app is built.
    monitor_source: Callable[[], StepMonitor | None] = field(default=_no_monitor)
    guard: WebhookGuard = field(default_factory=WebhookGuard)

    @property
    def monitor(self) -> StepMonitor | None:
        return self.monitor_source()

    @property
    def engine_client(self) -> Any:
        """vLLM's engine client once the endpoint plugin attached it, else None."""
        return self.control.engine_client

    def attach_engine(self, engine_client: Any) -> None:
        self.control.engine_client = engine_client

    @classmethod
    def build(
        cls,
        config: ControlConfig | None = None,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        monitor: StepMonitor | None = None,
        engine_client: Any = None,
    ) -> EngineRuntime:
        """A runtime of its own (for tests and tools): metrics on ``registry`` (a fresh one
        by default), a fixed ``monitor``, the default config unless one is given."""
        metrics = WardenMetrics(registry if registry is not None else CollectorRegistry())
        control = Controller(config if config is not None else ControlConfig(), metrics, clock)
        control.engine_client = engine_client
        return cls(control, metrics, lambda: monitor)


def of(request: Request) -> EngineRuntime:
    """The runtime a route's app was given (``install``)."""
    found: EngineRuntime = getattr(request.app.state, STATE_KEY)
    return found


def install(app: Any, rt: EngineRuntime) -> None:
    """Give ``app``'s routes ``rt``."""
    setattr(app.state, STATE_KEY, rt)


_runtime: EngineRuntime | None = None
_lock = threading.Lock()


def process_runtime() -> EngineRuntime:
    """The composition root: this API server's one runtime, created on first use from the
    config file, the process registry vLLM's ``/metrics`` serves and the stat logger's
    monitor."""
    global _runtime
    with _lock:
        if _runtime is None:
            metrics = process_metrics()
            _runtime = EngineRuntime(Controller(load_config(), metrics), metrics, process_monitor)
        return _runtime
