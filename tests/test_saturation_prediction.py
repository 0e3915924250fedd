"""One saturation prediction: the gauge dashboards and alerts read is the number admission's
saturation judge decides on (before, the gauge used Little's law and admission counted whole
batches, so the dashboard did not show what admission decided)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.saturation import SaturationState, predicted_wait
from exporter.settings import WardenSettings
from exporter.step_monitor import StepMonitor
from warden.control.config import SaturationSettings
from warden.control.saturation import breach


@pytest.mark.parametrize(
    ("running", "waiting", "drain"),
    [(8, 3, 4.0), (8, 20, 4.0), (2, 1, 0.5), (8, 0, 4.0), (1, 9, 10.0)],
)
def test_the_exported_wait_is_the_judges(running: int, waiting: int, drain: float) -> None:
    state = SaturationState(running=running, waiting=waiting, drain_rate=drain, service_s=1.0)
    predicted = predicted_wait(state)
    assert state.queue_wait_s == predicted
    # The judge refuses a typical request on exactly that number.
    found = breach(SaturationSettings(max_queue_wait_s=1e-9), state)
    if predicted:
        assert found is not None and found.signal == "queue_wait_s"
        assert found.value == predicted
    else:
        assert found is None


def test_a_partial_batch_waits_a_whole_batch_not_littles_law() -> None:
    # 3 waiting behind a full batch of 8 at 4 requests/s: Little's law says 0.75 s, but the
    # slots free a batch at a time: the request waits for the batch ahead, 8 / 4 = 2 s.
    state = SaturationState(running=8, waiting=3, drain_rate=4.0, service_s=1.0)
    assert state.queue_wait_s == pytest.approx(2.0)


def test_the_gauge_publishes_the_prediction() -> None:
    registry = CollectorRegistry()
    now = [1000.0]
    monitor = StepMonitor(WardenSettings(), WardenMetrics(registry), None, clock=lambda: now[0])
    for _ in range(10):
        now[0] += 0.25
        monitor.on_step(running=8, waiting=0, kv_usage=0.5, finished=[(96, 0.0, 2.0)])
    now[0] += 0.25
    snap = monitor.on_step(running=8, waiting=3, kv_usage=0.9)
    exported = registry.get_sample_value(catalog.QUEUE_WAIT_PREDICTED.name)
    assert exported == pytest.approx(predicted_wait(snap.saturation))
    assert exported == pytest.approx(8 / snap.saturation.drain_rate)
