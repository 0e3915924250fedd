"""Detects the hung engine that still answers /health: requests pending, no step completing.

Runs as a collector on the API process's background thread, because a stalled engine calls
nothing: the check must come from outside the step path.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.step_monitor import StepMonitor


class StallCollector:
    name = "stall"

    def __init__(
        self,
        monitor: StepMonitor,
        metrics: WardenMetrics,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.monitor = monitor
        self.timeout_s = timeout_s
        self.clock = clock
        self._gauge = metrics.get(catalog.ENGINE_STALLED)
        self._gauge.set(0)
        self._last_idle = clock()
        self.stalled = False

    def collect(self) -> None:
        now = self.clock()
        if self.monitor.pending_requests() == 0:
            self._last_idle = now
            self.stalled = False
        else:
            # Work arriving on an idle engine starts the clock; every completed step resets it.
            last_progress = max(self.monitor.snapshot.timestamp, self._last_idle)
            self.stalled = now - last_progress > self.timeout_s
        self._gauge.set(1 if self.stalled else 0)
