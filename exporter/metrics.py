"""prometheus_client objects for the catalog, built against a registry that is passed in.

vLLM serves ``/metrics`` from the global registry, or, when ``PROMETHEUS_MULTIPROC_DIR`` is set
for the process tree, from the files every process writes there. Plain metric objects work in
both modes, which is why warden uses them instead of custom collectors: a value set in the
worker process then shows up on the API server's ``/metrics``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from exporter import catalog
from exporter.catalog import MetricSpec

# Label values known up front: created at start so counters exist at 0 and rate() works
# from the first scrape instead of from the first event.
KNOWN_LABEL_VALUES: dict[str, dict[str, tuple[str, ...]]] = {
    catalog.MEMORY_UTILIZATION.name: {"source": catalog.MEMORY_SOURCES},
    catalog.MEMORY_RISK.name: {"source": catalog.MEMORY_RISK_SOURCES},
    catalog.SATURATION_TRANSITIONS.name: {"to": catalog.SATURATION_STATES},
    catalog.WATERMARK_TRANSITIONS.name: {"to": catalog.WATERMARK_LEVELS},
    catalog.NONFINITE_LOGITS.name: {"kind": catalog.NONFINITE_KINDS},
    catalog.ENGINE_ERRORS.name: {"class": catalog.ERROR_CLASSES},
    catalog.DEGRADATION_ACTIVE.name: {"action": catalog.DEGRADATION_ACTIONS},
    catalog.DEGRADATION_LEASES.name: {"source": catalog.LEASE_SOURCES},
    catalog.REQUESTS.name: {"outcome": catalog.REQUEST_OUTCOMES},
    catalog.ADMITTED_SLO.name: {"outcome": catalog.SLO_OUTCOMES},
    catalog.ADMISSION_REJECTIONS.name: {"reason": catalog.ADMISSION_REASONS},
    catalog.WEBHOOK_NOTIFICATIONS.name: {"outcome": catalog.WEBHOOK_OUTCOMES},
    catalog.REQUEST_RETRIES.name: {"reason": catalog.RETRY_REASONS},
    catalog.REQUEST_RETRIES_EXHAUSTED.name: {"reason": catalog.RETRY_REASONS},
    catalog.RELAY_NOTIFICATIONS.name: {"outcome": catalog.RELAY_NOTIFICATION_OUTCOMES},
    catalog.RELAY_ALERTS.name: {"outcome": catalog.RELAY_ALERT_OUTCOMES},
    catalog.RELAY_DELIVERIES.name: {"outcome": catalog.RELAY_DELIVERY_OUTCOMES},
}


def _build(spec: MetricSpec, registry: CollectorRegistry | None) -> Any:
    common: dict[str, Any] = {"registry": registry}
    if spec.kind == "counter":
        return Counter(spec.base, spec.help, spec.labels, **common)
    if spec.kind == "gauge":
        mode: Any = spec.multiprocess_mode
        return Gauge(spec.name, spec.help, spec.labels, multiprocess_mode=mode, **common)
    buckets = spec.buckets or Histogram.DEFAULT_BUCKETS
    return Histogram(spec.name, spec.help, spec.labels, buckets=buckets, **common)


class WardenMetrics:
    """All warden metric objects of one process, keyed by catalog name.

    Built lazily: a process creates only the metrics it writes, so the worker's files do not
    shadow the API server's gauges with zeros in multiprocess mode.
    """

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self._registry = registry
        self._metrics: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, spec: MetricSpec) -> Any:
        metric = self._metrics.get(spec.name)
        if metric is not None:
            return metric
        with self._lock:
            metric = self._metrics.get(spec.name)
            if metric is None:
                metric = _build(spec, self._registry)
                for label, values in KNOWN_LABEL_VALUES.get(spec.name, {}).items():
                    if spec.labels == (label,) and spec.kind == "counter":
                        for value in values:
                            metric.labels(value)
                self._metrics[spec.name] = metric
        return metric

    def ensure(self, specs: Iterable[MetricSpec]) -> None:
        """Create these metrics now, so they are exported before their first event."""
        for spec in specs:
            self.get(spec)


_process_metrics: WardenMetrics | None = None
_process_lock = threading.Lock()


def process_metrics() -> WardenMetrics:
    """The metrics of this process, on the global registry vLLM's ``/metrics`` serves."""
    global _process_metrics
    with _process_lock:
        if _process_metrics is None:
            _process_metrics = WardenMetrics(REGISTRY)
        return _process_metrics
