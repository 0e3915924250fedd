"""One saturation prediction: the gauge dashboards and alerts read is the number admission's
saturation judge decides on (before, the gauge used Little's law and admission counted whole
batches, so the dashboard did not show what admission decided)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.saturation import (
    OVERLOAD_RATIO,
    PACE_MIN_CHANGES,
    PACE_REMEMBER_S,
    PACE_SETTLED_CHANGES,
    KvState,
    PaceRecord,
    RecentOutput,
    SaturationMeter,
    SaturationState,
    StepTimes,
    batch_bucket,
    batch_drain_rate,
    predicted_wait,
    queue_turnover,
    slot_meets,
)
from exporter.settings import WardenSettings
from exporter.step_monitor import StepMonitor, StepSnapshot
from exporter.vllm_compat import EngineRequests
from warden.control.admission import RequestFacts, Saturation, judge_saturation, limit
from warden.control.config import AdmissionSettings, SaturationSettings
from warden.control.leases import Lease
from warden.control.policy import EffectivePolicy, combine
from warden.control.saturation import (
    DEEP_FACTOR_MAX,
    DEEP_FACTOR_MIN,
    DEEP_KEPT_FORECASTS,
    DEEP_RECENT_SHOWN,
    DeepAdmission,
    DeepSlotCalibration,
    assess,
    breach,
    with_live_queue,
)


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


def _full_batch(ages: tuple[float, ...], waiting: int = 0) -> SaturationState:
    """A full batch of 8 draining 4 requests/s (a whole batch: 2 s), served 1.5 s at p99."""
    return SaturationState(
        running=8,
        waiting=waiting,
        drain_rate=4.0,
        service_s=1.5,
        capacity=8,
        served_ages=ages,
    )


def test_a_full_batch_frees_its_first_slot_when_its_oldest_request_ends() -> None:
    """A momentary full batch at a light load (run 23, 0.5x): its requests started at
    different times, and the first slot frees within the service forecast of the oldest's
    start, not a whole batch later."""
    ages = (1.2, 0.9, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1)
    assert _full_batch(()).queue_wait_s == pytest.approx(2.0)  # ages unknown: a whole batch
    assert _full_batch(ages).queue_wait_s == pytest.approx(0.3)  # 1.5 - 1.2
    # The third request waiting takes the third slot to free: the third oldest's.
    assert predicted_wait(_full_batch(ages, waiting=2)) == pytest.approx(1.5 - 0.7)
    # A request served past the forecast already (a long one) is not counted on to end: the
    # first slot is the next oldest's.
    assert _full_batch((1.8, *ages[1:])).queue_wait_s == pytest.approx(1.5 - 0.9)
    # Requests that started together (an overload's batch) wait the whole batch, never more.
    assert _full_batch((0.1,) * 8).queue_wait_s == pytest.approx(1.4)
    assert _full_batch((0.0,) * 8).queue_wait_s == pytest.approx(1.5)
    # Fewer ages than the slot asks (another API server's requests, not yet started): the
    # whole batch's wait, as before.
    assert predicted_wait(_full_batch(ages[:2], waiting=2)) == pytest.approx(2.0)


def _measured_full_batch(times: list[float], ages: tuple[float, ...]) -> SaturationState:
    """A full batch of 8 whose recent requests were all served at 8 (nothing scaled)."""
    return SaturationState(
        running=8,
        waiting=0,
        drain_rate=4.0,
        service_s=max(times),
        capacity=8,
        recent_service=tuple((served, 8) for served in times),
        step_times=StepTimes({8: 0.05}),
        served_ages=ages,
    )


SPREAD = [0.5 + index / 31 for index in range(32)]  # 32 service times, 0.5-1.5 s


def test_the_first_slot_frees_when_any_running_request_ends() -> None:
    """Eight requests started together, with service times spread as the recent ones: the
    first to end does so, 99 times in 100, by the time 15 of 32 service times are over
    (none ended: (17/32)^8 = 0.006), not when the slowest could (run 24: refusals at 3x
    with no queue)."""
    state = _measured_full_batch(SPREAD, (0.0,) * 8)
    assert state.forecast_service_s == 1.5
    assert state.queue_wait_s == pytest.approx(SPREAD[14], abs=0.006)
    # The second slot is still the bound of the second oldest: 1.5 s.
    assert predicted_wait(dataclasses.replace(state, waiting=1)) == pytest.approx(1.5)
    # Staggered, the first end comes sooner still.
    staggered = _measured_full_batch(SPREAD, (0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1))
    assert staggered.queue_wait_s < SPREAD[14] - 0.3
    assert staggered.queue_wait_s < 1.5 - 0.9  # before the oldest's bound


def test_requests_that_all_take_as_long_free_their_slots_together() -> None:
    """Equal service times (the same prompt and output lengths): no request ends before the
    others, and the first slot frees when they all do, a whole service time after the batch
    started, as before."""
    state = _measured_full_batch([1.0] * 32, (0.2,) * 8)
    assert state.queue_wait_s == pytest.approx(0.8, abs=0.006)


def test_a_request_older_than_every_recent_one_is_not_counted_on_to_end() -> None:
    """A request that has run past every recent service time (a long one) says nothing of
    when it ends: the first slot is forecast from the others."""
    lone = _measured_full_batch(SPREAD, (2.0,) + (0.0,) * 7)
    together = _measured_full_batch(SPREAD, (0.0,) * 7)
    assert lone.queue_wait_s == pytest.approx(together.queue_wait_s)
    assert lone.queue_wait_s > SPREAD[14]  # seven, not eight, may end first


def test_a_queue_longer_than_the_batch_still_waits_whole_batches() -> None:
    ages = (1.2, 0.9, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1)
    # The 9th waiting needs the slot after a whole batch has turned over: 2 batches, 4 s.
    assert predicted_wait(_full_batch(ages, waiting=8)) == pytest.approx(4.0)


def test_the_oldest_requests_slot_decides_admission_at_the_slo() -> None:
    settings = SaturationSettings(latency_slo_s=2.5)
    young = with_live_queue(_full_batch(()), in_flight=8, capacity=8, served_ages=(0.2,) * 8)
    found = breach(settings, young)  # 1.3 s for the first slot + 1.5 s served: refused
    assert found is not None and found.value == pytest.approx(2.8)
    staggered = with_live_queue(
        _full_batch(()), in_flight=8, capacity=8, served_ages=(1.2, 0.9, 0.7, 0.5, 0.4, 0.3)
    )
    assert staggered.served_ages[0] == 1.2
    assert breach(settings, staggered) is None  # 0.3 s + 1.5 s


def _latency_p99_by_simulation(state: SaturationState, slot: int, draws: int = 50_000) -> float:
    """The 99th percentile of the latency of a request that takes the ``slot``-th freed slot,
    drawn: the wait until ``slot + 1`` running requests have ended (each one's end drawn from
    the recent service times longer than its age) plus the request's own service time, drawn
    independently."""
    rng = random.Random(7)
    times = state.forecast_service_times
    longer = [[t - age for t in times if t > age] for age in state.served_ages]
    latencies = sorted(
        sorted(rng.choice(rest) for rest in longer)[slot] + rng.choice(times) for _ in range(draws)
    )
    return latencies[int(0.99 * draws)]


STAGGERED = (0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)


@pytest.mark.parametrize(
    ("ages", "slot"),
    [
        ((0.0,) * 8, 0),
        (STAGGERED, 0),
        ((1.2, 1.1, 0.3, 0.3), 0),
        ((0.0,) * 8, 1),
        (STAGGERED, 1),
        (STAGGERED, 3),
        (STAGGERED, 7),
    ],
)
def test_a_slot_is_judged_on_its_wait_and_service_together(
    ages: tuple[float, ...], slot: int
) -> None:
    """The wait for a slot and the request's own service time are independent draws: their
    sum's 99th percentile is what the SLO must hold, not the sum of their 99th percentiles
    (run 25: at an SLO of 1.72 s, arrivals into a full batch with no queue were refused that
    would have finished in time; run 26: 3 at 0.5x behind one queued). Checked against a
    simulation of the same draws."""
    state = _measured_full_batch(SPREAD, ages)
    summed = predicted_wait(dataclasses.replace(state, waiting=slot)) + state.forecast_service_s
    drawn = _latency_p99_by_simulation(state, slot)
    assert drawn < summed  # the tails do not come together
    # Within one step of the service times' grid (1/31 s apart) either way.
    assert slot_meets(state, slot, drawn + 0.04) is True
    assert slot_meets(state, slot, drawn - 0.04) is False
    assert slot_meets(state, slot, state.forecast_service_s) is False


def test_admission_takes_a_shallow_slot_within_the_slo_that_the_summed_tails_refused() -> None:
    state = _measured_full_batch(SPREAD, STAGGERED)
    for slot in (0, 1, 3):
        queued = dataclasses.replace(state, waiting=slot)
        summed = predicted_wait(queued) + state.forecast_service_s
        joint = _latency_p99_by_simulation(state, slot)
        slo = (summed + joint) / 2
        assert breach(SaturationSettings(latency_slo_s=slo), queued) is None
        # Under the joint percentile it is refused, with the latency the sum forecast.
        found = breach(SaturationSettings(latency_slo_s=joint - 0.05), queued)
        assert found is not None and found.value == pytest.approx(summed)
    # The second half of the batch's slots (4 of 8 ahead) keeps the summed tails: a request
    # there starts as the batch turns over (run 25: 2.1% missed behind 4-7 queued).
    deep = dataclasses.replace(state, waiting=4)
    summed = predicted_wait(deep) + state.forecast_service_s
    slo = (summed + _latency_p99_by_simulation(state, 4)) / 2
    assert breach(SaturationSettings(latency_slo_s=slo), deep) is not None
    # A request that fits only when other requests free KV blocks has them ahead of it too.
    sized = dataclasses.replace(state, tokens_per_request=128.0)
    slo = (
        predicted_wait(state) + state.forecast_service_s + _latency_p99_by_simulation(state, 0)
    ) / 2
    assert breach(SaturationSettings(latency_slo_s=slo), sized, KvState(48, 32, 0.5), 64) is None
    assert breach(SaturationSettings(latency_slo_s=slo), sized, KvState(48, 32, 1.0), 64)


def test_a_deep_slot_is_judged_on_its_forecast_scaled_by_how_late_recent_ones_ran() -> None:
    """Every miss of runs 27 and 28 was at slots 6-7 of 8, admitted on the summed tails: the
    deep slots' forecast is scaled by how much later than forecast the requests admitted
    there ran. Admitted, the request carries the forecast the calibration learns from."""
    state = _measured_full_batch(SPREAD, STAGGERED)
    deep = dataclasses.replace(state, waiting=6)
    summed = predicted_wait(deep) + state.forecast_service_s
    settings = SaturationSettings(latency_slo_s=summed * 1.1)
    admitted = assess(settings, deep)
    assert admitted.breach is None and admitted.deep is not None
    assert admitted.deep.forecast_s == pytest.approx(summed)
    # Recent deep admissions ran 20% over their forecast: the same request is refused, and
    # the refusal says why.
    late = assess(settings, deep, deep_factor=1.2)
    assert late.breach is not None and late.breach.value == pytest.approx(summed * 1.2)
    assert "x1.20" in late.breach.message() and late.deep is not None
    assert late.deep.forecast_s == pytest.approx(summed) and late.deep.deep_factor == 1.2
    # Ahead of the deep slots (3 of 8 ahead) the factor changes nothing: those are judged on
    # their joint percentile, and no miss came from them.
    shallow = dataclasses.replace(state, waiting=3)
    shallow_settings = SaturationSettings(latency_slo_s=_latency_p99_by_simulation(state, 3) + 0.1)
    for factor in (1.0, DEEP_FACTOR_MAX):
        judged = assess(shallow_settings, shallow, deep_factor=factor)
        assert judged.breach is None and judged.deep is None
    # A batch with room: no slot to wait for, nothing deep.
    room = dataclasses.replace(state, running=5, waiting=0)
    assert assess(SaturationSettings(latency_slo_s=10.0), room, deep_factor=2.0).deep is None


def test_a_latency_refusal_says_what_its_forecast_was_made_of() -> None:
    """The refusals a light load still makes (issue #28) are told apart in /warden/state by
    their basis: the wait and service time the latency summed, the full batch's slot (none:
    the batch had room), and the batch and queue it was judged on."""
    state = _measured_full_batch(SPREAD, STAGGERED)
    deep = dataclasses.replace(state, waiting=6)
    wait, service = predicted_wait(deep), state.forecast_service_s
    assert service is not None
    found = assess(SaturationSettings(latency_slo_s=0.1), deep, deep_factor=1.2).breach
    assert found is not None
    assert state.service_s is not None
    assert found.basis() == {
        "wait_s": round(wait, 3),
        "service_s": round(service, 3),
        "measured_service_s": round(state.service_s, 3),
        "serving_batch": 8,
        "slowdown": 1.0,
        "slot": 6,
        "running": 8,
        "waiting": 6,
        "capacity": 8,
        "deep_factor": 1.2,
    }
    # Under an overload it says so, on the rates it was judged on: the requests offered and
    # what a full batch drains.
    drained = batch_drain_rate(state, 8)
    assert drained is not None
    offered = dataclasses.replace(deep, offered_per_s=2 * OVERLOAD_RATIO * drained)
    assert offered.overloaded
    judged = assess(SaturationSettings(latency_slo_s=0.1), offered, deep_factor=1.2).breach
    assert judged is not None
    basis = judged.basis()
    assert basis["offered_per_s"] == round(2 * OVERLOAD_RATIO * drained, 3)
    assert basis["full_batch_drain_per_s"] == round(drained, 3)
    # A batch with room: the service time alone was over, no slot was waited for.
    room = dataclasses.replace(state, running=5, waiting=0)
    alone = assess(SaturationSettings(latency_slo_s=0.1), room).breach
    assert alone is not None
    assert alone.basis() == {
        "wait_s": 0.0,
        "service_s": round(service, 3),
        "measured_service_s": round(state.service_s, 3),
        # Forecast at the batch it joins, the steps as fast as when the recent ones finished.
        "serving_batch": 6,
        "slowdown": 1.0,
        "running": 5,
        "waiting": 0,
        "capacity": 8,
    }

    # A queue-depth refusal names the batch and the queue only.
    depth = assess(SaturationSettings(max_queue_depth=4), deep).breach
    assert depth is not None
    assert depth.basis() == {"running": 8, "waiting": 6, "capacity": 8}


def test_the_deep_slot_calibration_learns_the_late_quantile_within_its_bounds() -> None:
    calibration = DeepSlotCalibration(window=32, min_samples=16)
    for _ in range(15):
        calibration.observe(DeepAdmission(2.0), 3.0)
    assert calibration.factor() == 1.0  # too few to say
    calibration.observe(DeepAdmission(2.0), 3.0)
    assert calibration.factor() == pytest.approx(1.5)
    # The window moves on: 32 requests that ran at 80-100% of their forecast.
    for index in range(32):
        calibration.observe(DeepAdmission(1.0), 0.8 + 0.2 * index / 31)
    assert calibration.factor() == pytest.approx(1.0)
    for _ in range(32):
        calibration.observe(DeepAdmission(1.0), 0.5)
    assert calibration.factor() == DEEP_FACTOR_MIN == 1.0  # early finishes admit no more
    calibration.observe(DeepAdmission(1.0), 30.0)  # one stalled request
    assert calibration.factor() == DEEP_FACTOR_MAX
    calibration.observe(DeepAdmission(0.0), 1.0)  # nothing to scale: ignored
    assert _learned(calibration) == {"factor": DEEP_FACTOR_MAX, "samples": 32}


def _learned(calibration: DeepSlotCalibration) -> dict[str, Any]:
    shown = calibration.to_json()
    return {"factor": shown["factor"], "samples": shown["samples"]}


def test_the_last_deep_admissions_are_shown_with_what_they_allowed_for_and_took() -> None:
    """``/warden/state`` shows each recent deep admission's forecast, the scales it was judged
    with and its real latency, newest first, the last ``DEEP_RECENT_SHOWN``: a run sees what
    admission allowed for before the engine turned slower."""
    now = [100.0]
    calibration = DeepSlotCalibration(clock=lambda: now[0])
    assert calibration.to_json()["recent"] == []
    for index in range(DEEP_RECENT_SHOWN + 4):
        now[0] = 100.0 + index
        calibration.observe(DeepAdmission(1.0 + index / 100, 1.1, 1.3, slot=index % 8), 1.2)
    calibration.observe(DeepAdmission(0.0), 1.0)  # nothing to scale: not shown either
    now[0] += 0.5
    recent = calibration.to_json()["recent"]
    assert len(recent) == DEEP_RECENT_SHOWN
    newest = DEEP_RECENT_SHOWN + 3
    assert recent[0] == {
        "ended_s_ago": 0.5,
        "slot": newest % 8,
        "forecast_s": round(1.0 + newest / 100, 3),
        "deep_factor": 1.1,
        "pace_margin": 1.3,
        "allowed_s": round((1.0 + newest / 100) * 1.3, 3),
        "latency_s": 1.2,
    }
    assert [r["ended_s_ago"] for r in recent] == [0.5 + i for i in range(DEEP_RECENT_SHOWN)]


def test_the_deep_slot_calibration_forgets_an_overload_once_it_is_over() -> None:
    """A factor learned in an overload does not refuse a later light load's bursts: each
    deep admission is forgotten ``DEEP_KEPT_FORECASTS`` of its forecasts after it ended (run
    35: 4x's 1.38 refused 11 requests at 0.5x a minute later)."""
    now = [0.0]
    calibration = DeepSlotCalibration(window=64, min_samples=16, clock=lambda: now[0])
    for index in range(20):  # an overload: deep admissions 1.4x later than their 0.7 s
        now[0] = index * 0.1
        calibration.observe(DeepAdmission(0.7), 0.98)
    assert calibration.factor() == pytest.approx(1.4)
    # While the overload's admissions are recent, the factor stands...
    now[0] = DEEP_KEPT_FORECASTS * 0.7 - 0.1
    assert calibration.factor() == pytest.approx(1.4)
    # ...as the first of them are forgotten, fewer than 16 are left: unscaled, as at the start.
    now[0] = DEEP_KEPT_FORECASTS * 0.7 + 0.45
    assert calibration.factor() == 1.0
    assert _learned(calibration) == {"factor": 1.0, "samples": 15}
    now[0] += 60.0
    assert _learned(calibration) == {"factor": 1.0, "samples": 0}
    # A new overload teaches it again.
    for _ in range(16):
        calibration.observe(DeepAdmission(0.7), 0.84)
    assert calibration.factor() == pytest.approx(1.2)


def test_a_slot_without_ages_or_service_times_keeps_the_summed_tails() -> None:
    """Nothing to draw from: the chance is unknown and the sum stands."""
    assert slot_meets(_measured_full_batch(SPREAD, ()), 0, 10.0) is None
    assert slot_meets(_full_batch((0.5,) * 8), 0, 10.0) is None  # no recent service times
    # Every running request already served past the forecast: none is counted on to end.
    assert slot_meets(_measured_full_batch(SPREAD, (2.0,) * 8), 0, 10.0) is None
    # Fewer running requests with an age than the slot needs.
    assert slot_meets(_measured_full_batch(SPREAD, (0.5, 0.4)), 2, 10.0) is None


def _gauge_after_a_full_batch(
    waiting: int, served_ages: tuple[float, ...] | None = None
) -> tuple[float | None, StepSnapshot]:
    """The exported wait after 2.5 s of a full batch finishing one 2 s request per step, then
    a step with ``waiting`` queued; the monitor reads ``served_ages`` when given."""
    registry = CollectorRegistry()
    now = [1000.0]
    monitor = StepMonitor(WardenSettings(), WardenMetrics(registry), None, clock=lambda: now[0])
    if served_ages is not None:
        monitor.served_requests = lambda: EngineRequests(served_ages)
    for _ in range(10):
        now[0] += 0.25
        monitor.on_step(running=8, waiting=0, kv_usage=0.5, finished=[(96, 0.0, 2.0)])
    now[0] += 0.25
    snap = monitor.on_step(running=8, waiting=waiting, kv_usage=0.9)
    return registry.get_sample_value(catalog.QUEUE_WAIT_PREDICTED.name), snap


def test_the_gauge_publishes_the_prediction() -> None:
    exported, snap = _gauge_after_a_full_batch(waiting=3)
    assert exported == pytest.approx(predicted_wait(snap.saturation))
    assert exported == pytest.approx(8 / snap.saturation.drain_rate)


def test_the_gauge_counts_the_oldest_requests_slot_as_admission_does() -> None:
    """The exported wait reads the same ages admission reads (``served_ages``): with a queue,
    the gauge is the number admission decides on, not a whole batch's wait."""
    ages = (1.9, 1.8, 1.5, 1.0, 0.8, 0.6, 0.4, 0.2)
    exported, snap = _gauge_after_a_full_batch(waiting=2, served_ages=ages)
    assert snap.saturation.served_ages[0] == 1.9
    # A request behind the two waiting takes the third slot to free: 2.0 s at p99, 1.5 s gone.
    assert exported == pytest.approx(0.5)
    assert exported == pytest.approx(predicted_wait(snap.saturation))
    live = with_live_queue(snap.saturation, 10, 8, served_ages=ages)
    assert exported == pytest.approx(predicted_wait(live))


# --- service time forecast in engine steps ------------------------------------------------------

SLO_S = 4.0  # under the burst's service time, as in run 13


def _burst(monitor: StepMonitor, now: list[float]) -> None:
    """A full batch of 8 with a queue (0.1 s steps, each request served 45 steps: 4.45 s, over
    the SLO). (Service times sit between two steps, where float sums cannot put them on either
    side.)"""
    for index in range(400):
        now[0] += 0.1
        done = [(96, 0.0, 4.45)] if index >= 45 and index % 5 == 0 else None
        monitor.on_step(running=8, waiting=4, kv_usage=0.9, finished=done)


def _light_load(monitor: StepMonitor, now: list[float], seconds: float) -> StepSnapshot:
    """One request at a time, 0.02 s steps."""
    snap = monitor.snapshot
    for _ in range(round(seconds / 0.02)):
        now[0] += 0.02
        snap = monitor.on_step(running=1, waiting=0, kv_usage=0.1)
    return snap


def _monitor(now: list[float], registry: CollectorRegistry | None = None) -> StepMonitor:
    metrics = WardenMetrics(registry or CollectorRegistry())
    return StepMonitor(WardenSettings(), metrics, None, lambda: now[0])


def test_after_a_burst_a_light_load_is_forecast_at_its_own_speed_and_admitted() -> None:
    """The service seconds recent requests took at a full batch are not what a request will take
    in a batch of one or two: scaled by the step times of the two batches, they are. Before, a
    light load after a burst was forecast the burst's 4.45 s, refused whenever anything ran, and
    finished too few requests to learn otherwise (run 13: 85 of 97 refused at 0.5x after 4x)."""
    now = [1000.0]
    monitor = _monitor(now)
    _burst(monitor, now)
    # Within a service time of the burst the batch may fill again: forecast at the full one.
    soon = _light_load(monitor, now, 2.0).saturation
    assert soon.recent_peak == 8
    assert soon.forecast_service_s == pytest.approx(4.45)
    # A service time later, at the light load's own speed.
    state = _light_load(monitor, now, 3.0).saturation
    assert state.service_s == pytest.approx(4.45)  # the seconds measured in the burst
    assert {batch for _served, batch in state.recent_service} == {8}
    assert (state.recent_peak, state.serving_batch) == (1, 2)
    # At the 0.02 s a step of the batch of one (batch two not measured yet) against the full
    # batch's 0.1 s: a fifth (the full batch's average took one 0.02 s step: 0.096 s).
    assert state.step_times is not None
    assert state.forecast_service_s == pytest.approx(4.45 * 0.02 / state.step_times.at(8))
    assert state.forecast_service_s < 1.0
    light = with_live_queue(state, in_flight=1, capacity=8)
    assert breach(SaturationSettings(latency_slo_s=SLO_S), light) is None
    # The seconds as measured, unscaled, refused it: 4.45 s over the SLO of 4 s.
    unscaled = dataclasses.replace(light, step_times=None)
    found = breach(SaturationSettings(latency_slo_s=SLO_S), unscaled)
    assert found is not None and found.signal == "latency_s"
    # A full batch with a queue is still forecast at the full batch's speed, and refused.
    full = with_live_queue(state, in_flight=12, capacity=8)
    assert full.serving_batch == 8
    assert full.forecast_service_s == pytest.approx(4.45)
    found = breach(SaturationSettings(latency_slo_s=SLO_S), full)
    assert found is not None and found.signal == "latency_s"


def test_under_overload_a_free_slot_is_forecast_at_the_full_batch() -> None:
    """A request that takes a slot freed a moment ago is served in the batch that fills again
    behind it, not in the part-full one it joins (run 5: forecast at the batch joined, 0.93-0.95
    of admitted requests within the SLO at 2x-4x)."""
    now = [1000.0]
    monitor = _monitor(now)
    for _ in range(50):  # the ramp: a batch of 4 steps in 0.05 s
        now[0] += 0.05
        monitor.on_step(running=4, waiting=0, kv_usage=0.4)
    _burst(monitor, now)
    now[0] += 0.1
    state = monitor.on_step(running=6, waiting=0, kv_usage=0.7).saturation
    live = with_live_queue(state, in_flight=6, capacity=8)
    assert (live.joining_batch, live.serving_batch) == (7, 8)
    # The full batch's 4.45 s, not scaled to the 0.05 s a step of the batch of 4 nearest to 7.
    assert live.forecast_service_s == pytest.approx(4.45)
    found = breach(SaturationSettings(latency_slo_s=4.0), live)
    assert found is not None and found.signal == "latency_s"


def test_under_steady_load_the_forecast_is_the_measured_quantile() -> None:
    """Served in the batch recent requests were served in, nothing is scaled: preemptions,
    recomputation and slow steps stay in the forecast as measured."""
    meter = SaturationMeter(keep=8, min_finished=3)
    now = 0.0
    state = meter.observe(now, 8, 0, [])
    for index in range(100):
        now += 0.1 if index % 3 else 0.3  # some steps slow (long prompts prefilled)
        # One in four requests was preempted and took three times as long.
        served = 6.0 if index % 4 == 0 else 2.0
        finished = [(96, 0.0, served)] if index >= 92 else []
        state = meter.observe(now, 8, 0, finished)
    full = with_live_queue(state, in_flight=8, capacity=8)
    assert full.serving_batch == 8
    assert full.forecast_service_s == full.service_s == 6.0


def test_an_engine_that_slows_is_forecast_slower_within_a_few_dozen_steps() -> None:
    """Steps 1.7x slower than while the recent requests were served (the machine's speed
    moved between two loads, run 18) raise the service forecast and the queue's wait within
    about 30 steps, before any slower request finishes: a request admitted at the old speed's
    edge of the SLO is refused."""
    now = [1000.0]
    monitor = _monitor(now)
    _burst(monitor, now)  # 0.1 s steps, 4.45 s served, 2 finished per second
    before = with_live_queue(monitor.snapshot.saturation, in_flight=8, capacity=8)
    assert before.slowdown == 1.0
    assert before.forecast_service_s == pytest.approx(4.45)
    wait = predicted_wait(before)  # one batch of 8 at about 2 finished per second
    assert wait == pytest.approx(4.0, rel=0.05)
    settings = SaturationSettings(latency_slo_s=10.0)
    assert breach(settings, before) is None  # about 8.5 s
    for _ in range(30):  # nothing finishes yet
        now[0] += 0.17
        monitor.on_step(running=8, waiting=0, kv_usage=0.9)
    after = with_live_queue(monitor.snapshot.saturation, in_flight=8, capacity=8)
    # 30 steps move the step time's average 79% of the way from 0.1 s to 0.17 s.
    expected = (0.1 + 0.07 * (1 - 0.95**30)) / 0.1
    assert after.slowdown == pytest.approx(expected, rel=0.01)
    assert after.service_s == pytest.approx(4.45)  # the measured seconds are kept as measured
    assert after.forecast_service_s == pytest.approx(4.45 * expected, rel=0.01)
    # The drain rate falls by the slowdown, on top of its decay while none finishes.
    unslowed = dataclasses.replace(after, finish_step_s=())
    assert unslowed.slowdown == 1.0
    assert predicted_wait(after) == pytest.approx(predicted_wait(unslowed) * expected, rel=0.01)
    assert breach(settings, unslowed) is None  # unslowed, still admitted
    found = breach(settings, after)
    assert found is not None and found.signal == "latency_s"
    assert found.value == pytest.approx(predicted_wait(after) + 4.45 * expected, rel=0.01)


def test_step_times_that_only_jitter_are_no_slowdown() -> None:
    """Prefills make single steps slower; a steady load whose steps jitter by a third keeps
    the forecast the measured quantile (no refusal for noise), and an engine that got faster
    is not forecast faster before its requests show it."""
    meter = SaturationMeter(keep=32, min_finished=3)
    now = 0.0
    state = meter.observe(now, 8, 0, [])
    for index in range(600):
        now += 0.13 if index % 3 == 0 else 0.085
        finished = [(96, 0.0, 2.0)] if index % 5 == 0 else []
        state = meter.observe(now, 8, 0, finished)
        if index > 200:
            assert state.slowdown == 1.0
    assert state.forecast_service_s == 2.0
    for _ in range(40):
        now += 0.05
        state = meter.observe(now, 8, 0, [])
    assert state.slowdown == 1.0
    assert state.forecast_service_s == 2.0


def test_a_request_that_starts_at_once_is_forecast_slower_only_for_a_lasting_slowdown() -> None:
    """On a shared machine the last 20 steps read 1.3-1.5x slower for a moment; a light
    load's request taking a free slot, with nothing waiting, was forecast that much slower
    and refused at an SLO its neighbours met (run 58: 25 at 0.5x). It delays no one's start:
    it is forecast slower only once the slowdown has lasted (about 100 steps). A request that
    would queue still follows the last 20 steps, and a slowdown that lasts reaches both."""
    meter = SaturationMeter(keep=32, min_finished=3)
    now = 0.0
    meter.observe(now, 3, 0, [])
    for index in range(2000):  # a light load: a batch of 3, 2.2 ms steps, 0.3 s served
        now += 0.0022
        meter.observe(now, 3, 0, [(96, 0.0, 0.3)] if index % 15 == 0 else [])
    for _ in range(25):  # a blip: 25 steps 1.5x slower, nothing finishes
        now += 0.0033
        state = meter.observe(now, 3, 0, [])
    settings = SaturationSettings(latency_slo_s=0.4)
    at_once = with_live_queue(state, in_flight=3, capacity=8)
    assert at_once.starts_at_once
    assert at_once.slowdown == 1.0
    assert at_once.forecast_service_s == pytest.approx(0.3)
    assert breach(settings, at_once) is None
    # /warden/state shows which reading a request arriving now is judged on, and both.
    shown = at_once.to_json()
    assert shown["starts_at_once"] is True and shown["slowdown"] == 1.0
    lasting_3, recent_3 = shown["lasting_step_s_by_batch"]["3"], shown["step_s_by_batch"]["3"]
    # 25 steps move the 20-step average 72% of the way to 3.3 ms, the lasting one 22%.
    assert recent_3 == pytest.approx(0.0022 + 0.0011 * (1 - 0.95**25), rel=0.01)
    assert lasting_3 == pytest.approx(0.0022 + 0.0011 * (1 - 0.99**25), rel=0.01)
    # The same moment judged for a request that would queue: the blip counts.
    queued = with_live_queue(state, in_flight=9, capacity=8)
    assert not queued.starts_at_once
    assert queued.slowdown > 1.3
    assert queued.to_json()["starts_at_once"] is False
    # The slowdown lasts: 300 steps (about 1 s), and a free slot's request is forecast it.
    for _ in range(300):
        now += 0.0033
        state = meter.observe(now, 3, 0, [])
    lasting = with_live_queue(state, in_flight=3, capacity=8)
    assert lasting.slowdown > 1.4
    assert lasting.forecast_service_s == pytest.approx(0.3 * lasting.slowdown, rel=0.01)
    found = breach(settings, lasting)
    assert found is not None and found.signal == "latency_s"
    assert found.slowdown == lasting.slowdown  # the refusal names the slowdown it was made on


def test_a_request_that_starts_at_once_on_an_engine_that_keeps_up_is_admitted() -> None:
    """A free slot, nothing waiting, room in the cache, and fewer requests offered than the
    engine drains: refused, the request would be refused for its own length alone (run 63: 9
    refused at 0.5x with 1-5 running, forecast 1.69-1.96 s against an SLO of 1.63 s). It is
    admitted whatever its forecast. Offered as much as the engine drains, or unknown, the
    batch fills again behind it and its forecast is judged (run 5); so it is with a request
    waiting, or no room in the cache for its prompt."""
    recent = tuple((2.0, 4) for _ in range(16))
    state = SaturationState(
        running=4, waiting=0, drain_rate=2.0, service_s=2.0, capacity=8,
        recent_service=recent, tokens_per_request=64.0, offered_per_s=1.0,
    )  # fmt: skip
    settings = SaturationSettings(latency_slo_s=1.0)
    drained = batch_drain_rate(state, 8)
    assert drained is not None and drained > 1.0
    assert state.starts_at_once and state.keeps_up and state.to_json()["keeps_up"] is True
    assert assess(settings, state).breach is None
    # Offered what the engine drains at a full batch, or not counted: judged on the forecast.
    for offered in (drained, None):
        outpaced = dataclasses.replace(state, offered_per_s=offered)
        assert not outpaced.keeps_up
        found = assess(settings, outpaced).breach
        assert found is not None and found.signal == "latency_s"
    # One waiting: it queues, and is judged.
    queued = dataclasses.replace(state, waiting=1)
    assert not queued.starts_at_once
    found = assess(settings, queued).breach
    assert found is not None and found.signal == "latency_s"
    # A free slot, but no room in the cache for the prompt: it waits for blocks, and is judged.
    kv = KvState(total_blocks=12, block_size=16, usage=0.95)
    found = assess(settings, state, kv, prompt_tokens=64).breach
    assert found is not None and found.signal == "latency_s"
    assert found.wait_s is not None and found.wait_s > 0


def test_a_burst_of_prefills_is_not_counted_twice_nor_kept_once_the_engine_empties() -> None:
    """A burst's prefills slow the steps at the batch a light load runs; the requests served
    in it took those steps already, and once the engine empties, the sizes it no longer steps
    say nothing of its speed now. Scaled by the median ratio and the burst's stale step times,
    a light load at 0.5x was refused with one request running (run 33: 45 of 320 refused)."""
    meter = SaturationMeter(keep=32, min_finished=3)
    now = 0.0
    meter.observe(now, 3, 0, [])
    for index in range(600):  # a light load: batch of 3, 2.2 ms steps, 0.3 s served
        now += 0.0022
        meter.observe(now, 3, 0, [(96, 0.0, 0.3)] if index % 15 == 0 else [])
    for index in range(150):  # a burst: the same batch, 4 ms steps (prefills), 0.6 s served
        now += 0.004
        state = meter.observe(now, 3, 0, [(96, 0.0, 0.6)] if index > 100 and index % 6 == 0 else [])
    served_in_burst = sum(1 for served, _batch in state.recent_service if served == 0.6)
    assert 0 < served_in_burst < len(state.recent_service) / 2
    # The steps are slower than when most recent requests finished: the drain rate says so...
    assert state.slowdown > 1.5
    # ...but the burst's own requests, the slowest, took the slow steps: not slowed again.
    assert state.forecast_service_s == pytest.approx(0.6, rel=0.02)
    # The engine empties to one request at its light-load speed, for over a service time.
    for _ in range(400):
        now += 0.002
        state = meter.observe(now, 1, 0, [])
    assert state.step_times is not None and state.step_times.at(3) > 0.0038  # the burst's, kept
    assert state.slowdown == 1.0
    assert state.forecast_service_s == pytest.approx(0.6)
    assert breach(SaturationSettings(latency_slo_s=0.63), with_live_queue(state, 2, 8)) is None


def _after_an_overload(step_at_8: float) -> SaturationState:
    """A light load's burst after an overload, as issue #28's probe recorded it: a full batch
    of 8 (stepped now, ``step_at_8``), sizes 3-6 stepped within the last service time, 7 last
    stepped 12 s ago (at the overload). One recent request was served at a mean batch of 7
    (0.47 s, its size's step 2.3 ms when it finished), four at 4 (0.33 s at 2.14 ms then,
    2.68 ms now: the engine 1.25x slower there)."""
    now = 100.0
    times = StepTimes()
    for size, step_s, at in (
        (3, 0.00215, now - 0.5),
        (4, 0.00268, now - 0.2),
        (6, 0.00281, now - 0.6),
    ):
        times.add(size, step_s, 1, at)
    times.add(7, 0.00229, 1, now - 12.0)
    times.add(8, step_at_8, 1, now)
    return SaturationState(
        running=8,
        waiting=0,
        drain_rate=20.0,
        service_s=0.47,
        capacity=8,
        recent_service=((0.47, 7),) + ((0.33, 4),) * 4,
        finish_step_s=(0.0023,) + (0.00214,) * 4,
        step_times=times,
        measured_at=now,
        sustained_batch=8,
    )


def test_a_batch_size_left_since_is_scaled_once_not_by_its_growth_and_the_slowdown() -> None:
    """A request served at a size the engine has not stepped since (its step ratio unknown) is
    scaled from its own step time then to the serving batch's now: that already holds how
    much slower the engine is. Scaled also by the slowdown other sizes read (its batch's
    growth over the size's old average, times 1.25), bursts at 0.5x after 4x were forecast up
    to 1.8x what their requests took, and refused at an SLO they met."""
    state = _after_an_overload(step_at_8=0.00332)
    assert state.step_ratios[0] is None  # size 7 not stepped within the last 0.47 s
    assert state.slowdown == pytest.approx(0.00268 / 0.00214)
    once = 0.00332 / 0.0023  # 8's step now over 7's when the request finished
    assert state.forecast_service_times[-1] == pytest.approx(0.47 * once)
    # Before: 7's average (2.29 ms, 12 s old) for the growth, then the slowdown on top.
    twice = 0.00332 / 0.00229 * state.slowdown
    assert 0.47 * twice > 0.8 > state.forecast_service_s
    # The engine slower as a whole than the batch's growth says: the slowdown stands.
    slow = _after_an_overload(step_at_8=0.0024)
    assert slow.forecast_service_times[-1] == pytest.approx(0.47 * slow.slowdown)
    # Its size stepped since (the ratio known): scaled by the growth and its own ratio.
    stepped = _after_an_overload(step_at_8=0.00332)
    assert stepped.step_times is not None
    stepped.step_times.add(7, 0.0023, 1, 100.0)  # size 7 stepped now, at its old speed
    assert stepped.step_ratios[0] == pytest.approx(1.0, abs=0.01)
    assert stepped.forecast_service_times[-1] == pytest.approx(0.47 * 0.00332 / 0.0023, rel=0.01)


def test_a_prefills_step_is_not_timed_as_a_step_of_the_batch() -> None:
    """A light load fills the batch one join at a time; each join's step prefills its prompt
    and takes longer than a decode. Timed as a step of the batch, the sizes the engine passes
    through while filling carried the prefills (run 33's probe: a step of 7 took 3.4 ms against
    2.4 ms for one of 8), and a request joining a larger batch than recent requests were
    served in was forecast that batch's slower steps (``batch_growth``) and refused."""
    now = [1000.0]
    monitor = _monitor(now)
    rng = random.Random(5)
    running, served_at, snap = 2, 0, monitor.snapshot
    monitor.on_step(running, 0, 0.3)
    for step in range(6000):
        if running < 7 and rng.random() < 0.02:  # a join: the prefill's step, 9 ms
            running += 1
            now[0] += 0.009
            snap = monitor.on_step(running, 0, 0.3, prefilled=1)
            continue
        now[0] += 0.002  # decodes: 2 ms at any batch this small
        done = running > 2 and step - served_at > 150
        if done:
            running, served_at = running - 1, step
        finished = [(96, 0.0, 0.35)] if done else []
        snap = monitor.on_step(running, 0, 0.3, finished=finished)
    times = monitor.saturation.step_times
    for batch in range(2, 8):
        assert times.at(batch) == pytest.approx(0.002), batch
    state = snap.saturation
    assert state.batch_growth(3, 7) == 1.0
    assert state.forecast_service_s == pytest.approx(state.service_s)


def test_a_sizes_first_slow_steps_weigh_as_one_in_their_number() -> None:
    """The engine's first steps at a new size are its slowest; seeded with the first, the
    average kept most of it for tens of steps, and the first light load after the warm-up was
    forecast those steps (the 0.5x probe: sizes 2 and 5 read 5.6-6.0 ms, 2.2-2.5 ms after)."""
    times = StepTimes()
    times.add(5, 0.006, 1)  # the first step at 5: cold
    for _ in range(10):
        times.add(5, 0.0024, 1)
    assert times.at(5) == pytest.approx((0.006 + 10 * 0.0024) / 11)
    for _ in range(200):  # then a moving average of about the last 20 steps, as before
        times.add(5, 0.003, 1)
    times.add(5, 0.005, 1)
    assert times.at(5) == pytest.approx(0.003 + 0.05 * 0.002, rel=1e-5)


def test_a_request_is_compared_with_its_own_batch_sizes_step_time_only() -> None:
    """A request that finished before its batch size was timed has no step time then, so its
    ratio is not that size's time now over a smaller size's it borrowed then."""
    meter = SaturationMeter(keep=8, min_finished=1)
    now = 0.0
    meter.observe(now, 2, 0, [])
    for running in (2, 6):  # 0.1 s at a batch of 2, 0.1 s at 6: served at a mean of 4
        for _ in range(50):
            now += 0.002
            meter.observe(now, running, 0, [])
    state = meter.observe(now, 6, 0, [(96, 0.0, 0.2)])
    assert state.recent_service == ((0.2, 4),) and state.finish_step_s == (None,)
    for _ in range(30):  # then steps of 4, twice as long as those of 2
        now += 0.004
        state = meter.observe(now, 4, 0, [])
    assert state.step_ratios == (None,) and state.slowdown == 1.0


def test_quiet_steps_are_counted_as_steps() -> None:
    """Steps that change nothing are recorded as quiet (not observed in full), yet each is a
    step the batch's speed is measured on."""
    now = [1000.0]
    monitor = _monitor(now)
    for _ in range(200):
        now[0] += 0.01
        monitor.on_step(running=4, waiting=0, kv_usage=0.5)
    assert monitor.saturation.step_times.at(4) == pytest.approx(0.01)


def test_a_request_is_placed_in_the_mean_batch_it_was_served_in() -> None:
    meter = SaturationMeter(keep=8, min_finished=1)
    now = 0.0
    meter.observe(now, 2, 0, [])
    for _ in range(10):  # 1 s at a batch of 2, then 1 s at a batch of 6
        now += 0.1
        meter.observe(now, 2, 0, [])
    for _ in range(10):
        now += 0.1
        meter.observe(now, 6, 0, [])
    state = meter.observe(now + 0.05, 6, 0, [(96, 0.0, 2.0)])
    assert state.recent_service == ((2.0, 4),)


def test_an_unmeasured_batch_size_borrows_the_nearest_smaller_one() -> None:
    times = StepTimes()
    assert times.at(3) is None
    times.add(4, 0.05, 1)
    assert times.at(2) == 0.05  # only a larger batch measured: its time
    times.add(1, 0.01, 1)
    assert times.at(2) == 0.01  # the nearest smaller batch: the first steps at 2 teach it
    assert times.at(6) == 0.05
    # Large batches share quarter-octave buckets: a few dozen averages for hundreds of slots.
    assert batch_bucket(16) == 16
    assert batch_bucket(250) == batch_bucket(256)
    assert len({batch_bucket(size) for size in range(1, 1025)}) < 45


def test_the_service_gauge_publishes_the_forecast() -> None:
    registry = CollectorRegistry()
    now = [1000.0]
    monitor = _monitor(now, registry)
    _burst(monitor, now)
    state = _light_load(monitor, now, 5.0).saturation
    exported = registry.get_sample_value(catalog.SERVICE_TIME.name)
    assert exported == pytest.approx(state.forecast_service_s)
    assert exported < state.service_s / 4


def _half_load_state(kv_usage: float) -> SaturationState:
    """A step at half load (4 of 8 slots running, each request served in 1 s, 96 tokens), two
    requests reported waiting: they arrived while the step ran."""
    meter = SaturationMeter(keep=32, min_finished=3)
    now = 0.0
    meter.observe(now, 4, 0, [], kv_usage=kv_usage)
    for _ in range(40):
        now += 0.25
        meter.observe(now, 4, 0, [(96, 0.0, 1.0)], kv_usage=kv_usage)
    now += 0.01
    return meter.observe(now, 4, 2, [], kv_usage=kv_usage)


# 48 blocks of 16 tokens: a typical request (96 tokens) takes 6.
KV_BLOCKS = (48, 16)


def test_requests_that_arrived_during_a_step_are_not_a_queue_at_a_light_load() -> None:
    """vLLM reports a request that arrived while a step ran as waiting until the next step
    starts it. Counted as a queue for a slot to free, a request arriving beside two of them at
    half load was forecast a whole batch's wait (1 s) plus its service (1 s), over an SLO of
    1.5 s, and refused at 0.5x (run 15). They have free slots and KV blocks: none waits."""
    state = _half_load_state(kv_usage=0.3)
    assert state.kv_usage == 0.3
    live = with_live_queue(state, in_flight=6, capacity=8, kv_blocks=KV_BLOCKS)
    assert (live.running, live.waiting) == (6, 0)
    assert live.queue_wait_s == 0.0
    assert breach(SaturationSettings(latency_slo_s=1.5), live) is None
    # Without the cache's geometry the two are taken to wait for a slot, as before; each
    # counted once (they were counted running and waiting both).
    unknown = with_live_queue(state, in_flight=6, capacity=8)
    assert (unknown.running, unknown.waiting) == (4, 2)
    found = breach(SaturationSettings(latency_slo_s=1.5), unknown)
    assert found is not None and found.signal == "latency_s"


def test_a_queue_held_back_by_the_kv_cache_still_waits() -> None:
    """Free slots but no free KV blocks (a loaded GPU's usual state: the cache, not the batch
    size, is the limit): the requests reported waiting stay waiting, and so does a new one."""
    state = _half_load_state(kv_usage=0.95)  # 2 free blocks: not one typical request
    live = with_live_queue(state, in_flight=6, capacity=8, kv_blocks=KV_BLOCKS)
    assert (live.running, live.waiting) == (4, 2)
    assert live.queue_wait_s == pytest.approx(1.0, rel=0.01)  # the batch ahead: 4 slots at 4/s
    found = breach(SaturationSettings(latency_slo_s=1.5), live)
    assert found is not None and found.signal == "latency_s"
    # Room for one of the two: one starts, the other still waits.
    one = with_live_queue(
        dataclasses.replace(state, kv_usage=0.8), in_flight=6, capacity=8, kv_blocks=KV_BLOCKS
    )
    assert (one.running, one.waiting) == (5, 1)


def test_a_queue_vllm_passed_over_waits_whatever_the_free_blocks_say() -> None:
    """Free blocks for a typical finished request (short ones finished of late), but the
    queue was there at the step before as well and vLLM started none of it: its scheduler
    held it back (long prompts that do not fit, as in a flood of them after short requests).
    None of it starts, and a new request queues behind it. The same two requests seen for the
    first time would start."""
    first = _half_load_state(kv_usage=0.3)
    assert not first.queue_held_over
    assert with_live_queue(first, in_flight=6, capacity=8, kv_blocks=KV_BLOCKS).waiting == 0
    meter = SaturationMeter(keep=32, min_finished=3)
    now = 0.0
    meter.observe(now, 4, 0, [], kv_usage=0.3)
    for _ in range(40):
        now += 0.25
        meter.observe(now, 4, 0, [(96, 0.0, 1.0)], kv_usage=0.3)
    meter.observe(now + 0.01, 4, 2, [], kv_usage=0.3)
    held = meter.observe(now + 0.26, 4, 2, [], kv_usage=0.3)
    assert held.queue_held_over
    live = with_live_queue(held, in_flight=6, capacity=8, kv_blocks=KV_BLOCKS)
    assert (live.running, live.waiting) == (4, 2)
    found = breach(SaturationSettings(latency_slo_s=1.5), live)
    assert found is not None and found.signal == "latency_s"
    # One of two started since: the other was passed over again.
    assert meter.observe(now + 0.3, 5, 1, [], kv_usage=0.35).queue_held_over
    # It started too (one finished beside it), and a new one came: that one is not held over.
    fresh = meter.observe(now + 0.35, 5, 1, [(96, 0.0, 1.0)], kv_usage=0.35)
    assert not fresh.queue_held_over


def test_the_step_monitor_hands_the_kv_use_to_the_saturation_state() -> None:
    now = [1000.0]
    monitor = _monitor(now)
    now[0] += 0.1
    assert monitor.on_step(running=2, waiting=1, kv_usage=0.4).saturation.kv_usage == 0.4


def _at_capacity(
    meter: SaturationMeter, now: float, step_s: float
) -> tuple[float, SaturationState]:
    """A load at capacity: a batch of 5 of 8, no queue, ``step_s`` steps, a request served
    in 2 s finishing every fifth step."""
    state = meter.observe(now, 5, 0, [])
    for index in range(300):
        now += step_s
        finished = [(96, 0.0, 2.0)] if index % 5 == 0 else []
        state = meter.observe(now, 5, 0, finished)
    return now, state


def _full_after_capacity(steps: int, step_s: float) -> SaturationState:
    """The load at capacity, then ``steps`` steps of ``step_s`` at a full batch with one
    request waiting, as a request arriving then sees it."""
    meter = SaturationMeter(keep=32, min_finished=3)
    now, state = _at_capacity(meter, 0.0, 0.06)
    for _ in range(steps):
        now += step_s
        state = meter.observe(now, 8, 1, [])
    return with_live_queue(state, in_flight=9, capacity=8)


def test_at_an_overloads_onset_the_full_batchs_slower_steps_are_forecast() -> None:
    """After a load at capacity served at a batch of 5, the batch fills behind a queue and
    each step takes 0.1 s instead of 0.06 s. The batch of 5 makes no more steps, so its time
    stays as it was and the slowdown 1.0; the step times of the full batch say it: once the
    batch has been full for half a service time (1 s), the service forecast is 2 s x 0.1 /
    0.06 and the batch drains that much slower. Before, the requests admitted at that onset
    were forecast at 1x's speed and missed the SLO (run 20: 14 of 16 misses at 2x in a
    point's first 4 s)."""
    meter = SaturationMeter(keep=32, min_finished=3)
    now, steady = _at_capacity(meter, 0.0, 0.06)
    steady = with_live_queue(steady, in_flight=5, capacity=8)
    assert steady.forecast_service_s == 2.0
    state = steady
    for _ in range(3):  # the batch fills behind a queue; nothing finishes yet
        now += 0.1
        state = meter.observe(now, 8, 6, [])
    # Full for 0.3 s of the last 1 s: forecast at the batch held, 6, not yet at 8.
    early = with_live_queue(state, in_flight=14, capacity=8)
    assert (early.joining_batch, early.sustained_batch, early.growing_batch) == (8, 6, 6)
    for _ in range(9):
        now += 0.1
        state = meter.observe(now, 8, 6, [])
    onset = with_live_queue(state, in_flight=14, capacity=8)
    assert onset.growing_batch == 8
    assert onset.to_json()["sustained_batch"] == 8  # /warden/state shows what it is forecast at
    assert onset.slowdown == 1.0  # the batch of 5's steps are as they were
    # (The step the batch grew in is counted to the batch of 5: 0.1 s moved its average.)
    times = onset.step_times
    assert times is not None and times.at(8) == pytest.approx(0.1)
    growth = 0.1 / times.at(5)
    assert growth > 1.6
    assert onset.batch_growth(5, 8) == pytest.approx(growth)
    assert onset.forecast_service_s == pytest.approx(2.0 * growth)
    # Eight slots at the batch of 5's rate per slot, each step that much longer.
    assert onset.slot_rate is not None and onset.drain_rate is not None
    unscaled = max(onset.drain_rate, onset.slot_rate * 8)
    assert batch_drain_rate(onset, 8) == pytest.approx(unscaled / growth)
    settings = SaturationSettings(latency_slo_s=4.0)
    found = breach(settings, onset)
    assert found is not None and found.signal == "latency_s"
    # Unscaled (the step times unknown), the same request was admitted: 2 s served, a wait
    # of a batch at 1x's rate.
    assert breach(settings, dataclasses.replace(onset, step_times=None)) is None


def test_a_deep_slot_at_an_overloads_onset_is_forecast_at_the_full_batch() -> None:
    """The batch filled 0.3 s ago behind a queue: a request that takes one of the first slots
    is still forecast at the batch the engine held (6), but one with half a batch or more
    queued ahead of it (a deep slot) is served only after those ahead, which keep the batch
    full: its wait and its service are forecast at the full batch's steps (runs 52 and 53:
    34-35 requests admitted in an overload's first second, the engine finishing 9). The
    exported wait for a queue that deep is the same number."""
    meter = SaturationMeter(keep=32, min_finished=3)
    now, state = _at_capacity(meter, 0.0, 0.06)
    for _ in range(3):
        now += 0.1
        state = meter.observe(now, 8, 6, [])
    deep = with_live_queue(state, in_flight=14, capacity=8)  # 6 queued: slot 6
    shallow = dataclasses.replace(deep, waiting=2)  # slot 2
    assert shallow.growing_batch == deep.growing_batch == 6
    full = deep.at_full_batch
    assert full.growing_batch == 8 and full.at_full_batch is full
    assert full.forecast_service_s is not None and deep.forecast_service_s is not None
    assert full.forecast_service_s > deep.forecast_service_s * 1.2
    assert predicted_wait(deep) == predicted_wait(full)
    assert deep.queue_wait_s == predicted_wait(full)
    # Deep, the request is judged on the full batch's forecast; its refusal says so.
    judged = assess(SaturationSettings(latency_slo_s=100.0), deep).deep
    assert judged is not None
    assert judged.forecast_s == pytest.approx(predicted_wait(full) + full.forecast_service_s)
    # The first slots keep the batch held: a light load's moment of queue is not refused
    # for a full batch it will not be served in (run 21).
    assert shallow.at_full_batch.growing_batch == 8
    assert predicted_wait(shallow) == predicted_wait(dataclasses.replace(shallow))
    assert predicted_wait(shallow) != predicted_wait(shallow.at_full_batch)


def _paced_meter(paces_ms: list[float], running: int = 8) -> tuple[SaturationMeter, float]:
    """A meter that saw one second of steps at each of ``paces_ms`` (ms per step) at a batch
    of ``running``, one observation per step, starting on a whole second."""
    meter = SaturationMeter()
    return meter, _step_at_paces(meter, 100.0, paces_ms, running)


def _step_at_paces(
    meter: SaturationMeter, now: float, paces_ms: list[float], running: int = 8
) -> float:
    """``meter`` sees one second of steps at each of ``paces_ms`` from ``now`` (a whole
    second, idle before it); returns the time at the end."""
    meter.observe(now, running, 4, [])
    for pace_ms in paces_ms:
        end = now + 1.0
        while now + pace_ms / 1000 <= end + 1e-9:
            now += pace_ms / 1000
            meter.observe(now, running, 4, [])
        now = end
    return now


def test_the_pace_margin_is_how_much_slower_the_pace_has_turned_within_seconds() -> None:
    """Each whole second at a full batch is timed, every step counted, and each two seconds'
    pace is compared with the two before: the margin is the 95th percentile of those
    changes over the last minute, so one slow second among steady ones counts for its share
    of a window, a pace that stays slow only at its turn, a faster one not at all."""
    steady = [10.0] * 30
    meter, now = _paced_meter(steady)
    assert meter.pace.margin(now + 0.5, 8) == 1.0
    # Three turns to 15 ms for two seconds each, among 10 ms: some of the windows after
    # one are 1.5x the windows before.
    turns = ([10.0] * 8 + [15.0, 15.0]) * 3
    meter, now = _paced_meter(turns)
    assert meter.pace.margin(now + 0.5, 8) == pytest.approx(1.5, rel=0.02)
    # A single slow second among steady ones: at most half a window's worth.
    blip, at = _paced_meter([10.0] * 10 + [15.0] + [10.0] * 10 + [15.0] + [10.0] * 10)
    assert blip.pace.margin(at + 0.5, 8) == pytest.approx(1.25, rel=0.02)
    # The engine turned 1.5x slower once in the minute and stayed so: the windows around the
    # turn (1.25, 1.5, 1.2) are 3 of 56 changes, allowed for short of the whole turn;
    # getting faster never counts.
    once, at = _paced_meter([10.0] * 30 + [15.0] * 30)
    assert once.pace.margin(at + 0.5, 8) == pytest.approx(1.2, rel=0.02)
    faster, at = _paced_meter([15.0] * 30 + [10.0] * 30)
    assert faster.pace.margin(at + 0.5, 8) == 1.0
    # Seconds at a part-full batch say nothing of a full one's pace; a batch one short of
    # full (a freed slot waiting a step for the next request) is full.
    part, at = _paced_meter(turns, running=5)
    assert part.pace.margin(at + 0.5, 8) == 1.0
    one_short, at = _paced_meter(turns, running=7)
    assert one_short.pace.margin(at + 0.5, 8) == pytest.approx(1.5, rel=0.02)
    assert len(one_short.pace.changes(at + 0.5, 8)) >= PACE_MIN_CHANGES
    assert part.pace.changes(at + 0.5, 8) == []
    assert part.pace.margin(at + 0.5, 5) == pytest.approx(1.5, rel=0.02)
    stalled, at = _paced_meter(([10.0] * 8 + [100.0, 100.0]) * 3)
    assert stalled.pace.margin(at + 0.5, 8) == 2.0  # PACE_MARGIN_MAX
    # Too few full seconds to tell, a minute later, or no capacity: no margin.
    short, at = _paced_meter([10.0, 10.0, 15.0, 15.0])
    assert short.pace.margin(at + 0.5, 8) == 1.0
    # Six full seconds are enough (an overload's onset is scaled within seconds): their
    # changes are 1.5, 1.2 and 1.0, and the largest of so few stands for the 95th percentile.
    onset, at = _paced_meter([10.0, 10.0, 15.0, 15.0, 15.0, 15.0])
    assert len(onset.pace.changes(at + 0.5, 8)) == 3
    assert onset.pace.margin(at + 0.5, 8) == pytest.approx(1.5, rel=0.02)
    assert meter.pace.margin(now + 61.0, 8) == 1.0
    assert meter.pace.margin(now + 0.5, None) == 1.0


def test_a_deep_slot_allows_for_the_engine_turning_slower() -> None:
    """Runs 52 and 53: the engine's pace moved 20-60% for seconds at a time, and the requests
    admitted deep into a full batch just before it slowed missed the SLO together. A deep
    slot's forecast is scaled by how much slower the engine's pace has lately turned within
    seconds (the larger of that and the deep-slot calibration), and the refusal names it;
    the first slots are judged as before."""
    meter, now = _paced_meter(([10.0] * 8 + [15.0, 15.0]) * 3)
    state = _measured_full_batch(SPREAD, STAGGERED)
    paced = dataclasses.replace(state, pace_record=meter.pace, measured_at=now + 0.5)
    assert paced.pace_margin == pytest.approx(1.5, rel=0.02)
    assert paced.to_json()["pace_margin"] == pytest.approx(1.5, rel=0.02)
    deep = dataclasses.replace(paced, waiting=6)
    judged = assess(SaturationSettings(latency_slo_s=100.0), deep).deep
    assert judged is not None and judged.pace_margin == paced.pace_margin
    forecast = judged.forecast_s
    settings = SaturationSettings(latency_slo_s=forecast * 1.3)
    assert assess(settings, dataclasses.replace(state, waiting=6)).breach is None
    found = assess(settings, deep).breach
    assert found is not None and found.value == pytest.approx(forecast * paced.pace_margin)
    assert "turned that much slower" in found.message()
    assert found.basis()["pace_margin"] == pytest.approx(1.5, rel=0.02)
    # The calibration, where larger, is the one applied and named.
    calibrated = assess(settings, deep, deep_factor=1.8).breach
    assert calibrated is not None and calibrated.value == pytest.approx(forecast * 1.8)
    assert "x1.80" in calibrated.message() and "turned" not in calibrated.message()
    # The first half of the slots: unchanged.
    shallow = dataclasses.replace(paced, waiting=3)
    slo = SaturationSettings(latency_slo_s=_latency_p99_by_simulation(state, 3) + 0.1)
    assert assess(slo, shallow).breach is None


def test_an_overloads_onset_allows_for_the_turns_of_earlier_overloads() -> None:
    """Run 60: at 4x the deep admissions of an overload's first seconds were judged with a
    pace margin of 1.00, since the last minute held too few changes to tell, and took
    1.05-1.27x their allowance; later in the point the margin read 1.27-1.56. While requests
    are offered faster than the engine drains them, until the last minute has measured the
    margin, the margin of the last ten minutes is its floor. A light load's burst, which
    does not offer more than the engine drains, is not scaled by an earlier overload (run
    35), and neither is an overload once its own minute has measured a steadier pace."""
    meter, now = _paced_meter(([10.0] * 8 + [15.0, 15.0]) * 3)  # an overload: margin 1.5
    earlier = meter.pace.margin(now + 0.5, 8)
    assert earlier == pytest.approx(1.5, rel=0.02)
    # Two idle minutes, then three seconds of a full batch: no change in the last minute.
    now = _step_at_paces(meter, now + 120.0, [10.0] * 3)
    at = now + 0.5
    assert meter.pace.reading(at, 8) == (1.0, 0, None)
    onset = meter.pace.reading(at, 8, overloaded=True)
    assert onset.margin == onset.remembered == pytest.approx(earlier)
    assert onset.changes == 0
    # Judged as admission does: a deep slot refused at the onset of an overload, admitted
    # in a light load's burst with the same batch and queue.
    state = _measured_full_batch(SPREAD, STAGGERED)
    burst = dataclasses.replace(
        state, waiting=6, pace_record=meter.pace, measured_at=at, offered_per_s=5.0
    )
    overload = dataclasses.replace(burst, offered_per_s=12.0)  # 3x the drain (4 a second)
    assert (burst.overloaded, overload.overloaded) == (False, True)
    assert dataclasses.replace(burst, offered_per_s=6.0).overloaded  # OVERLOAD_RATIO x 4
    judged = assess(SaturationSettings(latency_slo_s=100.0), burst).deep
    assert judged is not None and judged.pace_margin == 1.0
    settings = SaturationSettings(latency_slo_s=judged.forecast_s * 1.3)
    assert assess(settings, burst).breach is None
    found = assess(settings, overload).breach
    assert found is not None and found.pace_margin == pytest.approx(earlier)
    assert "turned that much slower" in found.message()
    shown = overload.to_json()
    assert shown["overloaded"] is True and shown["offered_per_s"] == 12.0
    assert shown["pace_margin"] == shown["pace_margin_remembered"] == round(earlier, 4)
    assert burst.to_json()["pace_margin_remembered"] is None
    # The overload's own minute, once it holds enough changes, stands for itself: a steady
    # pace is not scaled by an earlier turn.
    settled_at = _step_at_paces(meter, now, [10.0] * 12) + 0.5
    steady = meter.pace.reading(settled_at, 8, overloaded=True)
    assert steady.changes >= PACE_SETTLED_CHANGES and steady.remembered is None
    assert steady.margin == pytest.approx(1.0, abs=0.01)
    # An overload ten minutes on remembers nothing of this one.
    later = _step_at_paces(meter, settled_at + PACE_REMEMBER_S, [10.0] * 3) + 0.5
    assert meter.pace.reading(later, 8, overloaded=True) == (1.0, 0, 1.0)


def test_a_light_loads_moment_of_queue_is_not_forecast_at_the_full_batch() -> None:
    """A burst of a light load fills the batch for a moment and queues one request; the
    batch drains again long before a request admitted then ends, so it is forecast at the
    batch the engine held over the last half service time, not at the full one (run 21:
    forecast at the batch joined, 2 of 96 requests were refused at 0.5x)."""
    burst = _full_after_capacity(steps=3, step_s=0.1)
    assert burst.joining_batch == 8
    assert burst.sustained_batch < 8
    assert burst.forecast_service_s == pytest.approx(
        2.0 * burst.batch_growth(5, burst.sustained_batch)
    )
    assert burst.forecast_service_s < 2.0 * burst.batch_growth(5, 8)


def test_a_fuller_batch_whose_steps_take_about_as_long_changes_nothing() -> None:
    """At capacity the batch runs 5 to 8 and a queue forms now and then; a full batch's steps
    a tenth slower than the batch of 5's are within the step times' noise: the forecast is
    the measured quantile, no request refused for it."""
    full = _full_after_capacity(steps=40, step_s=0.066)
    assert full.batch_growth(5, 8) == 1.0
    assert full.forecast_service_s == 2.0
    assert full.slot_rate is not None
    assert batch_drain_rate(full, 8) == pytest.approx(full.slot_rate * 8)


def _outputs_measured(running: int = 5, ages: tuple[float, ...] = ()) -> SaturationState:
    """32 recent requests served at a batch of 8 that generated 48-144 tokens each (issue
    #28's benchmark: ``--random-output-len 96 --random-range-ratio 0.5``): 30 ms before the
    first token, then 10 ms a token, so the longest took 1.46 s and the shortest 0.50 s."""
    generated = [48 + 3 * index for index in range(32)]  # 48-141
    served = [0.03 + 0.01 * (n - 1) for n in generated]
    return SaturationState(
        running=running,
        waiting=0,
        drain_rate=6.0,
        service_s=max(served),
        capacity=8,
        recent_service=tuple((s, 8) for s in served),
        recent_output=tuple(
            RecentOutput(n, 0.01 * (n - 1) / s, 64) for n, s in zip(generated, served, strict=True)
        ),
        step_times=StepTimes({8: 0.01}),
        served_ages=ages,
    )


def _first_slot_s(state: SaturationState, limits: tuple[int | None, ...]) -> float:
    """The wait for the first slot a full batch frees, its running requests' limits known."""
    wait = predicted_wait(dataclasses.replace(state, served_limits=limits))
    assert wait is not None
    return wait


def test_a_batch_of_long_requests_frees_its_first_slot_later_than_one_of_short_ones() -> None:
    """Each running request's end is forecast for its own length (its ``max_tokens``, where
    the recent requests ran to theirs): 8 requests 0.3 s into 48 tokens end 0.2 s from now,
    8 into 141 tokens 1.13 s from now. Forecast as typical recent requests (limits unknown),
    both batches are taken to free a slot in between: the long batch's wait was
    underestimated, and requests admitted behind it ran late (issue #28, runs 49 and 50)."""
    state = _outputs_measured(running=8, ages=(0.3,) * 8)
    short = _first_slot_s(state, (48,) * 8)
    long = _first_slot_s(state, (141,) * 8)
    typical = _first_slot_s(state, ())
    assert short == pytest.approx(0.5 - 0.3, abs=0.01)
    assert long == pytest.approx(1.43 - 0.3, abs=0.01)
    assert short < typical < long
    # One short request among long ones frees the first slot; the second waits for a long one.
    mixed = dataclasses.replace(state, served_limits=(141,) * 7 + (48,))
    assert predicted_wait(mixed) == pytest.approx(0.2, abs=0.01)
    assert slot_meets(mixed, 1, 1.0) is False
    # A 48-token request (0.5 s) into the short batch's first slot is within a 1 s SLO; into
    # the long batch's it is not, and admission's joint draw says so.
    own = state.service_times_for(48)
    assert slot_meets(dataclasses.replace(state, served_limits=(48,) * 8), 0, 1.0, own) is True
    assert slot_meets(dataclasses.replace(state, served_limits=(141,) * 8), 0, 1.0, own) is False


def test_a_queue_of_long_requests_turns_over_slower_than_one_of_short_ones() -> None:
    """Two batches deep, a request waits for the running batch to end and for the queued
    requests ahead of it to end in turn, each holding its slot for its own length (its
    ``max_tokens``, ``queued_limits``). Counted in whole batches at the last completions'
    drain rate (6/s here), both queues were forecast the same 2.67 s wait, whatever the
    requests ahead would generate and however soon the running ones end (issue #28, run
    51: requests 2-4 batches deep waited 1.4-2.1 s for their first token where 0.8 s had
    been forecast)."""
    running = dataclasses.replace(
        _outputs_measured(running=8, ages=(0.3,) * 8),
        waiting=12,
        served_limits=(48,) * 8,
    )
    short = predicted_wait(dataclasses.replace(running, queued_limits=(48,) * 12))
    long = predicted_wait(dataclasses.replace(running, queued_limits=(141,) * 12))
    assert short is not None and long is not None
    # The running batch's slots free 0.2 s from now (48 tokens, 0.3 s in); 8 of the 12 queued
    # take them, and the 13th request takes the first of those to end: 0.5 s for 48 tokens,
    # 1.43 s for 141.
    assert short == pytest.approx(0.2 + 0.5, abs=0.01)
    assert long == pytest.approx(0.2 + 1.43, abs=0.01)
    # Without the running requests' ages nothing forecasts their ends: whole batches, as before.
    unknown = dataclasses.replace(running, served_ages=(), served_limits=(), queued_limits=())
    assert predicted_wait(unknown) == pytest.approx(2 * 8 / 6.0)
    # Queued requests whose limits are not known (places held, another API server's) are taken
    # to be typical recent ones.
    typical = predicted_wait(running)
    assert typical is not None and short < typical < long
    # Beyond the requests it follows one by one, the queue turns over at their pace.
    deep = predicted_wait(dataclasses.replace(running, waiting=200, queued_limits=(48,) * 200))
    assert deep == pytest.approx(200 / 8 * 0.5, rel=0.1)


def test_requests_the_model_stopped_early_say_a_limit_is_not_a_length() -> None:
    """Where the recent requests ran to their limits (``max_tokens`` reached, as under the
    benchmark's ``--ignore-eos``), a running request is forecast to run to its own; where the
    model stopped them (vLLM's finish reason), a limit says nothing of a request's length,
    and a batch of chat requests with a ``max_tokens`` of 4096 is forecast as the recent
    requests ran, not each as long as the longest. The meter keeps the finish reason."""
    ran_to_limit = _outputs_measured(running=8, ages=(0.3,) * 8)
    stopped = dataclasses.replace(
        ran_to_limit,
        recent_output=tuple(
            recent._replace(stopped_early=True) for recent in ran_to_limit.recent_output
        ),
    )
    chat = (4096,) * 8
    assert _first_slot_s(ran_to_limit, chat) == pytest.approx(1.43 - 0.3, abs=0.01)
    assert _first_slot_s(stopped, chat) == pytest.approx(_first_slot_s(stopped, ()))
    assert _first_slot_s(stopped, chat) < 0.65  # the first of 8 typical ones ends, p99
    # A new request's own forecast: a 96-token limit is cut to 96 from the longer ones either
    # way; from the shorter ones, lengthened only where they ran to their limits.
    assert stopped.service_times_for(96) != ran_to_limit.service_times_for(96)
    assert max(stopped.service_times_for(96)) == pytest.approx(0.03 + 0.01 * 95)
    assert min(stopped.service_times_for(96)) == pytest.approx(0.03 + 0.01 * 47)
    assert ran_to_limit.service_times_for(96) == pytest.approx([0.03 + 0.01 * 95] * 32)
    meter = SaturationMeter(keep=4, min_finished=1)
    meter.observe(10.0, 1, 0, [])
    state = meter.observe(10.5, 1, 0, [(160, 0.0, 0.5, 96, 0.475, 1.0), (160, 0.0, 0.5, 96, 0.475)])
    assert [recent.stopped_early for recent in state.recent_output] == [True, False]


def test_a_request_is_forecast_the_service_time_of_the_tokens_it_asks_for() -> None:
    """Service time is decoding, a token a step: a request that asks for at most 48 tokens
    is forecast what 48 take (the recent requests' prefill and API share, then their time per
    token for 47 more), not the longest recent request's time. One that asks for more than
    any recent request generated, or says nothing, is forecast the longest one's length: a
    limit is an upper bound, and most requests stop before it."""
    state = _outputs_measured(running=8)  # a full batch, as the recent requests'
    typical = state.forecast_service_s
    assert typical == pytest.approx(0.03 + 0.01 * 140)
    assert state.decode_pace == pytest.approx(0.01)
    assert state.forecast_service_for(48) == pytest.approx(0.03 + 0.01 * 47)
    assert state.forecast_service_for(96) == pytest.approx(0.03 + 0.01 * 95)
    assert state.forecast_service_for(1) == pytest.approx(0.03)
    for asks in (None, 141, 4096):
        assert state.forecast_service_for(asks) == pytest.approx(typical)
    # A prompt known to be 4x the recent ones' 64 tokens: their part before decoding (30 ms)
    # taken 4x; one no longer than theirs, as theirs.
    assert state.forecast_service_for(48, prompt_tokens=256) == pytest.approx(0.12 + 0.47)
    assert state.forecast_service_for(48, prompt_tokens=32) == pytest.approx(0.03 + 0.47)
    # Never longer than the longest recent request's length at the engine's pace, whatever
    # the prompt.
    assert state.forecast_service_for(141, prompt_tokens=100_000) == pytest.approx(typical)
    assert state.forecast_service_for(120, prompt_tokens=100_000) == pytest.approx(typical)
    # Where vLLM did not say what the recent requests generated: the recent times as they are.
    unknown = dataclasses.replace(state, recent_output=())
    assert unknown.forecast_service_for(48) == typical
    assert unknown.to_json()["recent_output_tokens"] is None
    assert state.to_json()["recent_output_tokens"] == 94.5


def test_a_short_request_is_admitted_at_an_slo_the_longest_recent_one_would_miss() -> None:
    """At an SLO of 1 s on an engine whose longest recent request took 1.43 s, a request
    asking for 48 tokens (0.50 s) is admitted and one asking for 120 (1.22 s) is refused,
    its refusal naming the limit its forecast was made for. Before, both were refused on the
    longest recent time (run 44: goodput 0.60-0.80 of capacity at 4x)."""
    settings = SaturationSettings(latency_slo_s=1.0)
    state = _outputs_measured(running=5)
    assert assess(settings, state).breach is not None  # a typical request: the longest's time
    assert assess(settings, state, output_tokens=48).breach is None
    found = assess(settings, state, output_tokens=120).breach
    assert found is not None
    assert found.basis()["output_tokens"] == 120
    assert found.basis()["service_s"] == pytest.approx(0.03 + 0.01 * 119, abs=0.001)
    # The recent times before the length cut them: the longest recent request's 1.43 s.
    assert found.basis()["scaled_service_s"] == pytest.approx(0.03 + 0.01 * 140, abs=0.001)


def test_a_short_requests_slot_is_judged_on_its_own_length() -> None:
    """In a full batch, the first freed slot's wait is the running requests' (their lengths
    unknown: the recent times); the request's own service time, drawn with it, is its own
    length's. A short request takes the slot at an SLO a typical one would miss there."""
    ages = (1.2, 1.0, 0.8, 0.6, 0.4, 0.3, 0.2, 0.1)
    state = _outputs_measured(running=8, ages=ages)
    assert slot_meets(state, 0, 1.0) is False
    assert slot_meets(state, 0, 1.0, state.service_times_for(48)) is True
    assert slot_meets(state, 0, 1.0, state.service_times_for(4096)) is False


def test_the_meter_keeps_what_each_recent_request_generated_where_vllm_said() -> None:
    """vLLM's per-request statistics carry the tokens generated and the seconds decoding
    (``vllm_compat.finished_requests``); the meter keeps both with each completion. A
    completion without them (an older vLLM) leaves the output unknown for the whole window:
    a mix would be scaled by some requests and not others."""
    meter = SaturationMeter(keep=4, min_finished=1)
    now = 10.0
    state = meter.observe(now, 1, 0, [])
    for index in range(4):
        now += 0.5
        state = meter.observe(now, 1, 0, [(160, 0.0, 0.5, 96, 0.475 - index * 0.001)])
    assert state.recent_output[0] == RecentOutput(96, pytest.approx(0.95), 64)  # type: ignore[arg-type]
    assert [recent.generated for recent in state.recent_output] == [96] * 4
    # One aborted before its first token: generated none, known all the same.
    now += 0.5
    state = meter.observe(now, 1, 0, [(64, 0.0, 0.1, 0, 0.0)])
    assert [recent.generated for recent in state.recent_output] == [96] * 3 + [0]
    now += 0.5
    state = meter.observe(now, 1, 0, [(160, 0.0, 0.5)])
    assert state.recent_output == ()
    assert state.service_s == 0.5


def test_vllms_finished_request_stats_give_the_tokens_generated_and_the_decode_time() -> None:
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats

    from exporter import vllm_compat

    iteration = IterationStats()
    iteration.finished_requests = [
        FinishedRequestStats(
            finish_reason=None,  # type: ignore[arg-type]
            e2e_latency=1.2,
            num_prompt_tokens=64,
            num_generation_tokens=96,
            queued_time=0.2,
            prefill_time=0.05,
            decode_time=0.9,
        )
    ]
    assert vllm_compat.finished_requests(iteration) == [
        (160, 0.2, pytest.approx(1.0), 96, 0.9, 0.0)
    ]


def test_finished_requests_say_whether_the_model_stopped_them_before_their_limit() -> None:
    """vLLM's finish reasons: a stop token or string (and a repetition) is the model ending
    the request; ``max_tokens``, the context or the client's abort are not."""
    from types import SimpleNamespace

    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.stats import FinishedRequestStats

    from exporter import vllm_compat

    def finished(reason: FinishReason) -> FinishedRequestStats:
        return FinishedRequestStats(
            finish_reason=reason,
            e2e_latency=1.0,
            num_prompt_tokens=10,
            num_generation_tokens=20,
            queued_time=0.25,
            decode_time=0.5,
        )

    reasons = [FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT, FinishReason.REPETITION]
    rows = vllm_compat.finished_requests(
        SimpleNamespace(finished_requests=[finished(reason) for reason in reasons])
    )
    assert [row[5] for row in rows] == [1.0, 0.0, 0.0, 1.0]
    assert rows[0][:5] == (30, 0.25, 0.75, 20, 0.5)


def test_before_its_body_a_request_is_judged_as_the_shortest_then_on_its_own_limit() -> None:
    """The body route's first check (``judge_saturation``, before the body is parsed) knows
    nothing of what the request asks for, so it refuses only where even a one-token request
    would miss the SLO; ``limit`` then judges each on its own ``max_tokens``, the cap's where
    a cap is in force."""
    settings = AdmissionSettings(saturation=SaturationSettings(latency_slo_s=1.0))
    saturation = Saturation(_outputs_measured(running=5))
    assert judge_saturation(settings, saturation).admit
    policy = EffectivePolicy()
    long = limit(RequestFacts(max_tokens=120), policy, settings, None, saturation)
    assert (long.admit, long.signal, (long.basis or {})["output_tokens"]) == (
        False,
        "latency_s",
        120,
    )
    assert limit(RequestFacts(max_tokens=48), policy, settings, None, saturation).admit
    assert not limit(RequestFacts(), policy, settings, None, saturation).admit  # no limit given
    # A cap of 48 in force: the request asking for 120 gets 48 and is judged on them.
    cap = Lease("webhook", "a", "cap_max_tokens", {"max_tokens": 48}, expires_at=1e12)
    capped = limit(RequestFacts(max_tokens=120), combine([cap]), settings, None, saturation)
    assert (capped.admit, capped.cap) == (True, 48)
    # Where no request could meet it (a deep queue), the first check refuses before parsing.
    deep = Saturation(dataclasses.replace(_outputs_measured(running=8), waiting=40))
    assert not judge_saturation(settings, deep).admit


def test_a_long_request_is_forecast_a_shorter_ones_time_plus_the_rest_at_the_engines_pace() -> None:
    """A request asking for more tokens than a recent one generated is forecast that one's
    time plus the tokens it lacks at the pace of all recent tokens: one recent request that
    decoded slower than the longest makes a long request late where it is promised the
    longest's time (run 45: most of the late requests at 4x asked for 110-144 tokens), and
    its own slow pace stretched to the long request's length sets a forecast the engine does
    not run at (run 46: 21 refused at 0.5x after an overload). The batch is full, as the
    recent requests' was."""
    state = _outputs_measured(running=8)
    generated, _decode, prompt, _stopped = state.recent_output[16]  # 96 tokens, 10 ms a token
    slow = 0.03 + 0.015 * (generated - 1)  # decoded at 15 ms a token: 1.455 s
    service, output = list(state.recent_service), list(state.recent_output)
    service[16] = (slow, 8)
    output[16] = RecentOutput(generated, 0.015 * (generated - 1) / slow, prompt)
    state = dataclasses.replace(state, recent_service=tuple(service), recent_output=tuple(output))
    decoded = sum(recent.generated - 1 for recent in state.recent_output)
    pace = (0.01 * (decoded - (generated - 1)) + 0.015 * (generated - 1)) / decoded
    assert state.decode_pace == pytest.approx(pace)
    assert state.forecast_service_s == pytest.approx(slow)
    # 45 tokens more than the slow one generated, at the engine's pace: more than its 1.455 s
    # and than the longest's 1.43 s, less than its own pace would make it (2.13 s).
    long_request = state.forecast_service_for(141)
    assert long_request == pytest.approx(slow + (141 - generated) * pace)
    assert slow < long_request < 0.03 + 0.015 * 140
    assert state.forecast_service_for(96) == pytest.approx(slow)
    assert state.forecast_service_for(48) == pytest.approx(0.03 + 0.015 * 47)


def test_after_an_overload_a_long_request_is_forecast_at_its_own_batchs_pace() -> None:
    """Run 46's light load after an overload: the recent requests were served in a full
    batch, the overload's short mix, a few of them at a burst's slow pace. A long request
    arriving to an engine with 2 running is forecast within the SLO that plain vLLM met
    there (0.81 s), not their pace stretched to its length (0.88 s), nor their pace at all:
    their steps carried a full batch's prefills. Where the recent requests ran in a batch
    no larger than this one's, their pace is its own, and the tokens they lacked are added."""
    generated = [40 + 2 * index for index in range(32)]  # 40-102, the overload's short mix
    paces = [0.0085 if index < 4 else 0.004 for index in range(32)]  # 4 short ones in a burst
    served = [0.02 + pace * (n - 1) for n, pace in zip(generated, paces, strict=True)]
    state = SaturationState(
        running=2,
        waiting=0,
        drain_rate=6.0,
        service_s=max(served),
        capacity=8,
        recent_service=tuple((s, 8) for s in served),
        recent_output=tuple(
            RecentOutput(n, pace * (n - 1) / s, 64)
            for n, pace, s in zip(generated, paces, served, strict=True)
        ),
        step_times=StepTimes({8: 0.004}),
    )
    stretched = max(0.02 + pace * (102 - 1) for pace in paces)  # each one's own pace
    assert stretched > 0.81
    assert state.decode_pace is None  # none served in a batch of 3 or fewer
    assert state.forecast_service_for(144) == pytest.approx(max(served))
    assert assess(SaturationSettings(latency_slo_s=0.81), state, output_tokens=144).breach is None
    # The same requests served in a batch of 3, the one this request joins: their pace.
    light = dataclasses.replace(state, recent_service=tuple((s, 3) for s in served))
    assert light.decode_pace is not None and 0.004 < light.decode_pace < 0.0045
    forecast = light.forecast_service_for(144)
    assert forecast is not None and max(served) < forecast < 0.81


def test_live_copies_of_a_state_share_its_forecasts_and_a_new_basis_gets_its_own() -> None:
    """Admission builds a live copy of the last step's state for each request; the forecasts
    by limit are worked out once per basis (the scaled recent times, what those requests
    generated, the serving batch), not once per copy, and equal what a copy works out alone.
    A state measured anew (other recent requests) is forecast from its own."""
    state = _outputs_measured(running=8, ages=(0.3,) * 8)
    queued = (48, 96, 141, None, 60)
    first = dataclasses.replace(state, waiting=5, queued_limits=queued, served_limits=(96,) * 8)
    second = dataclasses.replace(first, waiting=4, offered_per_s=30.0)
    assert second._shared_forecasts is first._shared_forecasts
    forecast = first.service_times_for(48)
    assert second.service_times_for(48) is forecast
    wait = queue_turnover(second, 5, 1.0)
    # The same state with nothing shared (a fresh basis object) works out the same numbers.
    alone = dataclasses.replace(second)
    alone.__dict__["_shared_forecasts"] = type(second._shared_forecasts)()
    assert alone.service_times_for(48) == forecast
    assert queue_turnover(alone, 5, 1.0) == pytest.approx(wait)
    slower = dataclasses.replace(
        first, recent_service=tuple((served * 2, batch) for served, batch in first.recent_service)
    )
    assert slower._shared_forecasts is not first._shared_forecasts
    assert max(slower.service_times_for(48)) == pytest.approx(2 * max(forecast))


def test_the_pace_changes_move_as_each_bucket_completes() -> None:
    """Admission reads the pace changes for each deep request; they are worked out once per
    completed bucket, and a bucket completing with a slower pace shows at the next read."""
    record = PaceRecord(bucket_s=1.0, keep_s=120.0)
    for second in range(6):
        record.record(second + 0.5, 0.9, 90, 8)  # 10 ms a step at a full batch
    before = record.changes(6.2, 8)
    assert record.changes(6.7, 8) == before  # the same whole buckets
    for second in range(6, 8):
        record.record(second + 0.5, 0.9, 45, 8)  # 20 ms a step
    after = record.changes(8.1, 8)
    assert after != before
    assert max(after) > 1.5
