"""What the API process knows about the engine, refreshed once per engine step.

vLLM calls the stat logger with each batch of engine outputs; the monitor turns that into the
watermark (from the KV cache and the device-side ratios on the signal board), the last-step
time, and a snapshot that step listeners (the local reflex) read in the same call. Everything
here is arithmetic on values already in memory: no I/O, no device access.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.settings import WardenSettings
from exporter.signals import SignalBoard
from exporter.watermark import Watermark


@dataclass
class StepSnapshot:
    """The engine as of its last step, in warden's own terms (vLLM's structures are unstable)."""

    timestamp: float = 0.0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    preempted: int = 0
    watermark: int = 0
    signals: dict[str, float] = field(default_factory=dict)


StepListener = Callable[[StepSnapshot], None]


class StepMonitor:
    def __init__(
        self,
        config: WardenSettings,
        metrics: WardenMetrics,
        board: SignalBoard | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.board = board
        self.clock = clock
        self.snapshot = StepSnapshot()
        self.watermark = Watermark(config.thresholds, config.watermark_hysteresis)
        self._listeners: list[StepListener] = []
        self._listener_errors = metrics.get(catalog.COLLECTOR_ERRORS)
        self._level = metrics.get(catalog.MEMORY_WATERMARK)
        self._ratio = metrics.get(catalog.MEMORY_UTILIZATION)
        self._transitions = metrics.get(catalog.WATERMARK_TRANSITIONS)
        self._last_step = metrics.get(catalog.ENGINE_LAST_STEP)
        metrics.get(catalog.SOURCE_AVAILABLE).labels("kv_cache").set(1)
        self._level.set(0)
        self._peak = metrics.get(catalog.MEMORY_WATERMARK_PEAK)
        self._peak.set(0)
        self.inflight: Callable[[], int] | None = None
        self.watermark_changed_at: float | None = None
        # Recent (time, level) changes, for /warden/state and for measuring reaction times.
        self.transitions: deque[tuple[float, int]] = deque(maxlen=64)
        self._lock = threading.Lock()

    def add_listener(self, listener: StepListener) -> None:
        self._listeners.append(listener)

    def on_step(
        self, running: int | None, waiting: int | None, kv_usage: float | None, preempted: int = 0
    ) -> StepSnapshot:
        now = self.clock()
        snap = self.snapshot
        with self._lock:
            snap = StepSnapshot(
                timestamp=now,
                running=snap.running if running is None else running,
                waiting=snap.waiting if waiting is None else waiting,
                kv_cache_usage=snap.kv_cache_usage if kv_usage is None else kv_usage,
                preempted=preempted,
            )
            signals = {"kv_cache": snap.kv_cache_usage}
            if self.board is not None:
                signals.update(self.board.read_max(5 * self.config.collector_interval_s, now))
            change = self.watermark.update(signals)
            snap.watermark = self.watermark.level
            snap.signals = signals
            self.snapshot = snap
        self._last_step.set(now)
        for source, value in signals.items():
            self._ratio.labels(source).set(value)
        if change is not None:
            self.watermark_changed_at = now
            self.transitions.append((now, change.current))
            self._level.set(change.current)
            self._transitions.labels(change.entered).inc()
        self.publish_peak(now)
        for listener in self._listeners:
            try:
                listener(snap)
            except Exception:
                self._listener_errors.labels(getattr(listener, "name", "step_listener")).inc()
        return snap

    def peak_level(self, now: float) -> int:
        """Highest level held at any moment of the last peak window. Prometheus scrapes every
        few seconds; a spike the reflex absorbs faster than that must not fall between two."""
        since = now - self.config.watermark_peak_window_s
        peak = self.watermark.level
        in_force_at_start = 0
        for at, level in list(self.transitions):  # a copy: the step path appends meanwhile
            if at < since:
                in_force_at_start = level
            else:
                peak = max(peak, level)
        return max(peak, in_force_at_start)

    def publish_peak(self, now: float) -> None:
        self._peak.set(self.peak_level(now))

    def pending_requests(self) -> int:
        """Requests the engine owes an answer: its last count, or the client's in-flight count."""
        pending = self.snapshot.running + self.snapshot.waiting
        if self.inflight is not None:
            pending = max(pending, self.inflight())
        return pending


_monitor: StepMonitor | None = None
_monitor_lock = threading.Lock()


def process_monitor(factory: Callable[[], StepMonitor] | None = None) -> StepMonitor | None:
    """The API process's monitor; created by the stat logger, read by endpoints and the reflex."""
    global _monitor
    with _monitor_lock:
        if _monitor is None and factory is not None:
            _monitor = factory()
        return _monitor
