"""The collector protocol and the runner that keeps a failing collector from hurting the engine.

A collector reads one source and sets metric objects. The runner calls each collector on a
background thread, never on the engine's step path; an exception is counted in
``warden_collector_errors_total{collector}``, logged (rate-limited) and the collector is tried
again next round, so one broken source never stops the others or the engine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from exporter import catalog
from exporter.metrics import WardenMetrics

log = logging.getLogger("warden.exporter")


@runtime_checkable
class Collector(Protocol):
    name: str

    def collect(self) -> None: ...


class CollectorRunner:
    def __init__(
        self,
        collectors: Sequence[Collector],
        metrics: WardenMetrics,
        interval_s: float,
        log_every_s: float = 60.0,
    ) -> None:
        self.collectors = list(collectors)
        self._errors = metrics.get(catalog.COLLECTOR_ERRORS)
        for collector in self.collectors:
            self._errors.labels(collector.name)
        self.interval_s = interval_s
        self._log_every_s = log_every_s
        self._last_logged: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> None:
        for collector in self.collectors:
            try:
                collector.collect()
            except Exception as exc:
                self._errors.labels(collector.name).inc()
                now = time.monotonic()
                if now - self._last_logged.get(collector.name, -1e9) >= self._log_every_s:
                    self._last_logged[collector.name] = now
                    log.warning(
                        "warden collector %s failed and was skipped: %r", collector.name, exc
                    )

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="warden-collectors", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.interval_s)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


class FailingCollector:
    """Test switch (WARDEN_TEST_FAILING_COLLECTOR=1): a collector that always raises."""

    name = "test_failing"

    def collect(self) -> None:
        raise RuntimeError("deliberately failing collector (WARDEN_TEST_FAILING_COLLECTOR=1)")
