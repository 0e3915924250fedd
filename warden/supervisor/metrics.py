"""The supervisor's numbers as a Prometheus page, for when no engine serves them.

While the circuit is open the engine is down, and with it its /metrics; the supervisor then
answers on the serving port (and always on its own port) with the same catalog series built
from its state, so the circuit-open metric that pages a person can actually be scraped.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from exporter import catalog
from exporter.supervisor_state import SupervisorState


def histogram_buckets(durations: list[float], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    buckets = [(repr(float(b)), float(sum(1 for d in durations if d <= b))) for b in bounds]
    return [*buckets, ("+Inf", float(len(durations)))]


class _StateCollector:
    def __init__(self, state: SupervisorState, ready: bool) -> None:
        self.state = state
        self.ready = ready

    def collect(self) -> Iterator[Metric]:
        state = self.state
        restarts = CounterMetricFamily(
            catalog.ENGINE_RESTARTS.base, catalog.ENGINE_RESTARTS.help, labels=["reason"]
        )
        for reason, total in sorted(state.all_restart_totals().items()):
            restarts.add_metric([reason], float(total))
        yield restarts
        durations = state.restart_durations()
        spec = catalog.ENGINE_RESTART_DURATION
        yield HistogramMetricFamily(
            spec.name,
            spec.help,
            buckets=histogram_buckets(durations, spec.buckets),
            sum_value=sum(durations),
        )
        for gauge, value in (
            (catalog.SUPERVISOR_CIRCUIT_OPEN, state.circuit_open),
            (catalog.ENGINE_EAGER_MODE, state.eager),
            (catalog.ENGINE_READY, self.ready),
        ):
            yield GaugeMetricFamily(gauge.name, gauge.help, value=1.0 if value else 0.0)
        spec = catalog.MEMORY_RESTART_RISK
        restart_risk = GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        for source, risk in sorted(state.memory_restart_risk.items()):
            restart_risk.add_metric([source], float(risk))
        yield restart_risk


def render(state: SupervisorState, ready: bool) -> bytes:
    registry = CollectorRegistry()
    registry.register(_StateCollector(state, ready))  # type: ignore[arg-type]
    return generate_latest(registry)
