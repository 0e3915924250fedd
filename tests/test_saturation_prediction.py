"""One saturation prediction: the gauge dashboards and alerts read is the number admission's
saturation judge decides on (before, the gauge used Little's law and admission counted whole
batches, so the dashboard did not show what admission decided)."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.saturation import SaturationMeter, SaturationState, predicted_wait
from exporter.settings import WardenSettings
from exporter.step_monitor import StepMonitor
from warden.control.config import SaturationSettings
from warden.control.saturation import breach, with_live_queue


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
    # 3 waiting behind a full batch of 8 at 4 requests/s, when nothing says when each running
    # request started: Little's law says 0.75 s, but requests admitted together finish
    # together: the request waits for the batch ahead, 8 / 4 = 2 s.
    state = SaturationState(running=8, waiting=3, drain_rate=4.0, service_s=1.0)
    assert state.queue_wait_s == pytest.approx(2.0)


def test_a_request_behind_a_staggered_batch_waits_for_the_slot_due_first() -> None:
    """A full batch of 8 whose requests started 0.1 s apart (service 1 s, 8 per second): the
    ninth request gets the oldest's slot, due in 0.3 s; whole batches said 1 s. The k-th
    waiting one gets the k-th slot due; past the batch, a whole batch per round."""
    since = tuple(0.1 * i for i in range(8))  # busy-clock starts, oldest first
    full = SaturationState(
        running=8,
        waiting=0,
        drain_rate=8.0,
        service_s=1.0,
        capacity=8,
        running_since=since,
        busy_clock=0.7,
    )
    assert full.queue_wait_s == pytest.approx(0.3)
    assert dataclasses.replace(full, waiting=3).queue_wait_s == pytest.approx(0.6)
    assert dataclasses.replace(full, waiting=8).queue_wait_s == pytest.approx(0.3 + 1.0)
    # Admission judges with the same number: under an SLO of 1.5 s the ninth request is
    # admitted (0.3 s + 1 s); counted in whole batches it was refused (1 s + 1 s).
    slo = SaturationSettings(latency_slo_s=1.5)
    assert breach(slo, full) is None
    assert breach(slo, dataclasses.replace(full, running_since=())) is not None


def test_a_burst_admitted_together_waits_a_whole_service_time() -> None:
    """Eight requests that start in the same step are due together: the ninth waits for the
    whole service time (the slowest recent one), however fast the batch drains on average."""
    meter = SaturationMeter(keep=32, min_finished=3)
    now = 0.0
    meter.observe(now, 1, 0, [])
    for _ in range(6):  # one at a time, 0.5 s each: the service time is learned
        now += 0.5
        meter.observe(now, 1, 0, [(96, 0.0, 0.5)])
    now += 0.5
    meter.observe(now, 0, 0, [(96, 0.0, 0.5)])
    now += 5.0
    burst = meter.observe(now, 8, 0, [])
    assert burst.running_since == (burst.busy_clock,) * 8
    ninth = with_live_queue(burst, in_flight=8, capacity=8)
    assert ninth.queue_wait_s == pytest.approx(0.5)


def test_the_meter_keeps_each_running_requests_start() -> None:
    """A finished request takes the start nearest its service time ago; a preempted one the
    youngest (scheduled last); new ones start at this step."""
    meter = SaturationMeter(keep=32, min_finished=1)
    meter.observe(0.0, 1, 0, [])  # busy clock 0: A starts
    meter.observe(1.0, 2, 0, [])  # 1: B
    meter.observe(2.0, 3, 0, [])  # 2: C
    state = meter.observe(3.0, 3, 0, [(96, 0.0, 2.1)])  # B (served 2 s) ends, D starts at 3
    assert state.running_since == (0.0, 2.0, 3.0)
    state = meter.observe(4.0, 2, 1, [], preempted=1)  # D, the youngest, is preempted
    assert state.running_since == (0.0, 2.0)
    assert state.busy_clock == 4.0


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
    # One started every step (0.25 s) and each is served 2 s: the fourth waiting request
    # gets the fourth-oldest's slot, due in 0.75 s, sooner than the whole batch (2 s).
    assert exported == pytest.approx(snap.saturation.slot_due_in(3))
    assert exported == pytest.approx(0.75)
    assert exported < 8 / snap.saturation.drain_rate
