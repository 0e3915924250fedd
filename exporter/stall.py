"""Collectors on the API process's background thread, for what must change when no step comes:
the stall check (the hung engine that still answers /health) and the watermark peak's decay.
A stalled engine calls nothing, so these checks must come from outside the step path.
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


class WatermarkPeakCollector:
    """Lets the peak level decay on schedule when no step comes to update it (idle engine)."""

    name = "watermark_peak"

    def __init__(self, monitor: StepMonitor, clock: Callable[[], float] = time.time) -> None:
        self.monitor = monitor
        self.clock = clock

    def collect(self) -> None:
        self.monitor.publish_peak(self.clock())
