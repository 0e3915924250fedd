"""The memory watermark on a GPU, proved through FAKES of the GPU-only sources (no GPU here).

FakeH200Allocator and FakeH200Nvml implement exporter.adapters' AllocatorSource and
DeviceMemorySource for one simulated NVIDIA H200 (140.54 GiB) running a vLLM engine profile in
simulated time. Everything downstream of the adapters is the real code: the allocator and NVML
collectors, the signal publisher and its memory plan, the shared-memory signal board, the step
monitor and its watermark with hysteresis and hold, the local reflex and the controller.

The fake's physics, stated so the assertions can be checked against it: NVML "used" is
PyTorch's reserved bytes plus 0.75 GiB the process held before vLLM allocated anything (CUDA
context, NCCL, cuBLAS). vLLM's plan is its requested memory, ``gpu_memory_utilization`` x total,
on top of that. The caching allocator grows reserved towards what the engine demands; a
``cudaMalloc`` for the largest activation segment (1 GiB) fails once less than that is free on
the device, and the allocator then frees its cache and retries (``num_alloc_retries``, one per
simulated minute while it lasts); once demand exceeds the device, allocations fail for good
(``num_ooms``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from exporter import catalog
from exporter.adapters import AllocatorStats, DeviceMemory
from exporter.device_collectors import AllocatorCollector, NvmlCollector, SignalPublisher
from exporter.memory_risk import MemoryBudget, MemoryPlanner, risk_ratio
from exporter.metrics import WardenMetrics
from exporter.settings import WardenSettings
from exporter.signals import SignalBoard
from exporter.step_monitor import StepMonitor, StepSnapshot
from exporter.watermark import CRITICAL, HIGH, NORMAL, OOM_IMMINENT, Watermark
from warden.control.config import ControlConfig
from warden.control.controller import Controller
from warden.control.reflex import Reflex

GIB = 2**30
H200_TOTAL = int(140.54 * GIB)
CONTEXT = int(0.75 * GIB)  # in use on the device before vLLM allocates
BURST = 1 * GIB  # the largest activation segment the engine asks the allocator for
STARTUP_S = 60.0  # weights, KV cache and CUDA graphs allocated within the first minute
HOUR = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class EngineProfile:
    """What one vLLM engine asks of the device over time (bytes as functions of seconds)."""

    name: str
    utilization: float
    demand: Callable[[float], float]  # reserved bytes the engine wants, after start-up
    allocated: Callable[[float], float]  # bytes live tensors hold, after start-up

    @property
    def budget(self) -> int:
        """vLLM's requested memory (v1/worker/utils.py request_memory)."""
        return math.ceil(H200_TOTAL * self.utilization)


class FakeH200:
    """FAKE H200 memory for an engine profile at the clock's simulated time."""

    def __init__(self, profile: EngineProfile, clock: Clock) -> None:
        self.profile = profile
        self.clock = clock
        self.retries = 0
        self.ooms = 0
        self.first_retry_at: float | None = None
        self.first_oom_at: float | None = None
        self._last_minute = -1

    def reserved(self) -> int:
        t = self.clock.now
        demand = self.profile.demand(t)
        if t < STARTUP_S:
            demand *= t / STARTUP_S
        return int(min(demand, H200_TOTAL - CONTEXT))

    def advance(self) -> None:
        """Allocator retries and OOMs happen as the engine runs; counted once a minute."""
        t = self.clock.now
        minute = int(t // 60)
        if minute == self._last_minute:
            return
        self._last_minute = minute
        demand = self.profile.demand(t)
        free = H200_TOTAL - CONTEXT - self.reserved()
        if demand > H200_TOTAL - CONTEXT:
            self.ooms += 1
            self.first_oom_at = self.first_oom_at if self.first_oom_at is not None else t
        elif free < BURST:
            self.retries += 1
            self.first_retry_at = self.first_retry_at if self.first_retry_at is not None else t


class FakeH200Allocator:
    """FAKE of exporter.adapters.TorchCudaAllocator (PyTorch's caching allocator on cuda:0)."""

    def __init__(self, device: FakeH200) -> None:
        self.device = device

    def availability(self) -> str | None:
        return None

    def read(self, device_index: int) -> AllocatorStats:
        self.device.advance()
        reserved = self.device.reserved()
        allocated = min(reserved, int(self.device.profile.allocated(self.device.clock.now)))
        return AllocatorStats(
            allocated, reserved, H200_TOTAL, self.device.retries, self.device.ooms
        )


class FakeH200Nvml:
    """FAKE of exporter.adapters.NvmlDevices: one visible H200."""

    def __init__(self, device: FakeH200) -> None:
        self.device = device

    def availability(self) -> str | None:
        return None

    def device_indices(self) -> list[int]:
        return [0]

    def read(self, index: int, engine_pids: object = ()) -> DeviceMemory:
        return DeviceMemory(self.device.reserved() + CONTEXT, H200_TOTAL)


def _wobble(amplitude_gib: float, period_s: float, seed: int = 0) -> Callable[[float], float]:
    """Batch-to-batch noise: a sine plus a little seeded jitter, in bytes."""
    rng = random.Random(seed)
    jitter = [rng.uniform(-1, 1) for _ in range(997)]

    def at(t: float) -> float:
        wave = math.sin(2 * math.pi * t / period_s)
        return (0.7 * wave + 0.3 * jitter[int(t) % 997]) * amplitude_gib * GIB

    return at


def idle(utilization: float) -> EngineProfile:
    """Weights + KV cache + graphs fill the budget but the activation reserve (2 GiB)."""
    footprint = math.ceil(H200_TOTAL * utilization) - 2 * GIB
    return EngineProfile(
        f"{utilization} idle", utilization, lambda t: footprint, lambda t: footprint - 0.3 * GIB
    )


def saturated(utilization: float) -> EngineProfile:
    """Full batches all day: activations use the reserve and then some (vLLM's profile misses
    a few hundred MiB of non-torch and allocator rounding), wobbling batch to batch."""
    budget = math.ceil(H200_TOTAL * utilization)
    wobble = _wobble(0.3, 90)
    return EngineProfile(
        f"{utilization} saturated",
        utilization,
        lambda t: budget + 0.4 * GIB + wobble(t),
        lambda t: budget - 1.5 * GIB + wobble(t),
    )


def field_creep() -> EngineProfile:
    """The field report: reserved 99 -> 134.7 GiB in the first hour, 140.9 GiB by hour six,
    allocated flat near 99 GiB. An engine whose plan fits that (99 GiB of weights and KV cache
    and a 2 GiB activation reserve: gpu_memory_utilization 0.72)."""

    def demand(t: float) -> float:
        if t <= HOUR:
            return (99 + (134.7 - 99) * t / HOUR) * GIB
        return (134.7 + (140.9 - 134.7) * (t - HOUR) / (5 * HOUR)) * GIB

    wobble = _wobble(0.4, 120, seed=1)
    return EngineProfile("creep", 0.72, demand, lambda t: 99 * GIB + wobble(t))


@dataclass
class Run:
    levels: list[tuple[float, int]]  # (time, level) at each step
    transitions: list[tuple[float, int]]
    device: FakeH200
    monitor: StepMonitor
    registry: CollectorRegistry

    def first(self, level: int) -> float | None:
        return next((t for t, lvl in self.levels if lvl >= level), None)

    def max_transitions_per_minute(self) -> int:
        times = [t for t, _ in self.transitions]
        return max((sum(1 for u in times if t <= u < t + 60) for t in times), default=0)


def simulate(profile: EngineProfile, hours: float, step_s: float = 60.0, tmp_path=None) -> Run:
    """Collectors and one engine step every ``step_s`` simulated seconds, for ``hours``."""
    clock = Clock()
    registry = CollectorRegistry()
    metrics = WardenMetrics(registry)
    device = FakeH200(profile, clock)
    path = str(tmp_path / f"board-{profile.name.replace(' ', '-')}")
    board = SignalBoard(path, create=True)
    allocator = AllocatorCollector(FakeH200Allocator(device), 0, metrics)
    nvml = NvmlCollector(FakeH200Nvml(device), metrics)
    budget = MemoryBudget(profile.budget, CONTEXT)  # what vLLM's worker says at init_device
    settings = WardenSettings(collector_interval_s=step_s)
    planner = MemoryPlanner(budget, settings.memory_settle_s, clock.now)
    publisher = SignalPublisher(board, 0, allocator, nvml, planner, metrics, clock=clock)
    monitor = StepMonitor(settings, metrics, SignalBoard(path), clock=clock)
    levels = []
    while clock.now <= hours * HOUR:
        for collector in (allocator, nvml, publisher):
            collector.collect()
        snap = monitor.on_step(running=64, waiting=8, kv_usage=0.99)
        levels.append((clock.now, snap.watermark))
        clock.now += step_s
    transitions = [(at, level) for at, level, *_ in monitor.transitions]
    return Run(levels, transitions, device, monitor, registry)


@pytest.mark.parametrize(
    "profile",
    [idle(0.92), saturated(0.92), idle(0.95), saturated(0.95)],
    ids=lambda p: p.name,
)
def test_an_engine_within_its_plan_reads_normal_all_day(profile: EngineProfile, tmp_path) -> None:
    """Default 0.92 idle and saturated, 0.95 saturated: raw used/total sits at 0.90 to 0.96,
    the KV cache is full, and the watermark never leaves normal."""
    run = simulate(profile, hours=12, tmp_path=tmp_path)
    assert {level for _, level in run.levels} == {NORMAL}, profile.name
    assert run.transitions == []
    assert run.device.retries == run.device.ooms == 0
    used = run.registry.get_sample_value(catalog.MEMORY_UTILIZATION.name, {"source": "device"})
    assert used is not None and used > 0.88  # what a raw watermark would have called high
    risk = run.registry.get_sample_value(catalog.MEMORY_RISK.name, {"source": "device"})
    assert risk is not None and risk < 0.25


def test_steady_saturation_changes_level_at_most_six_times_a_minute(tmp_path) -> None:
    """Second by second for an hour, at 0.95 (the tightest default-like plan) with batch noise:
    the watermark does not move at all."""
    run = simulate(saturated(0.95), hours=1, step_s=1.0, tmp_path=tmp_path)
    assert run.max_transitions_per_minute() <= 6
    assert run.transitions == []


def test_field_creep_reads_high_before_allocator_retries_and_oom_imminent_before_the_oom(
    tmp_path,
) -> None:
    run = simulate(field_creep(), hours=7, tmp_path=tmp_path)
    device = run.device
    assert device.first_retry_at is not None and device.first_oom_at is not None
    high, critical, oom = (run.first(level) for level in (HIGH, CRITICAL, OOM_IMMINENT))
    assert high is not None and critical is not None and oom is not None
    print(
        f"\nH200 creep: high at {high / HOUR:.2f} h, critical {critical / HOUR:.2f} h, "
        f"oom_imminent {oom / HOUR:.2f} h; allocator retries from "
        f"{device.first_retry_at / HOUR:.2f} h, first OOM {device.first_oom_at / HOUR:.2f} h"
    )
    assert high < critical < oom
    assert high < device.first_retry_at  # warned hours before the allocator struggles
    assert oom < device.first_oom_at
    # Each level is entered once, in order: no flapping on the way up.
    assert [level for _, level in run.transitions] == [HIGH, CRITICAL, OOM_IMMINENT]
    retries = run.registry.get_sample_value(catalog.TORCH_ALLOC_RETRIES.name, {"device": "cuda:0"})
    assert retries == device.retries > 0


def test_the_reflex_acts_on_the_creep_at_critical_and_names_the_signal(tmp_path) -> None:
    """The creep through the real reflex and controller: nothing at high (a warning), stop
    admission from critical, reject all at oom_imminent; each lease names its cause."""
    run = simulate(field_creep(), hours=7, tmp_path=tmp_path)
    clock = Clock()
    controller = Controller(ControlConfig(), WardenMetrics(CollectorRegistry()), clock=clock)
    reflex = Reflex(controller.config.reflex, controller, clock=clock)
    in_force: dict[int, list[str]] = {}
    for at, level in run.levels:
        clock.now = at
        snap = StepSnapshot(
            timestamp=at, watermark=level, watermark_source="device", watermark_value=0.9
        )
        reflex(snap)
        in_force.setdefault(level, controller.policy().active_actions())
    assert in_force[NORMAL] == [] and in_force[HIGH] == []
    assert in_force[CRITICAL] == ["stop_admission"]
    assert set(in_force[OOM_IMMINENT]) == {"stop_admission", "reject_all"}
    leases = controller.state_json()["leases"]
    assert {lease["cause"]["signal"] for lease in leases} == {"memory_watermark"}
    values = {lease["cause"]["value"] for lease in leases}
    assert values <= {"critical: device risk 0.900", "oom_imminent: device risk 0.900"}


def test_a_neighbour_on_the_gpu_raises_device_risk_but_not_allocator_risk() -> None:
    """Another process takes 9 GiB on a 0.92 engine's device: the device signal sees it, the
    engine's own allocator does not, and the watermark names the device."""
    budget = math.ceil(H200_TOTAL * 0.92)
    planner = MemoryPlanner(MemoryBudget(budget, CONTEXT), settle_s=300, started_at=0)
    normal = planner.observe(budget + CONTEXT, budget, H200_TOTAL, now=600)
    assert normal.device == 0 and normal.allocator == 0
    crowded = planner.observe(budget + CONTEXT + 9 * GIB, budget, H200_TOTAL, now=700)
    assert crowded.allocator == 0
    assert crowded.device is not None and crowded.device > 0.80
    mark = Watermark(WardenSettings().thresholds, 0.05, 20)
    mark.update(crowded.signals(), now=700)
    assert mark.level == HIGH and mark.worst_source == "device"


def test_without_a_budget_the_plan_is_the_settled_peak() -> None:
    """kv_cache_memory_bytes (or an unreadable worker): the peak of the first settle window."""
    planner = MemoryPlanner(MemoryBudget(), settle_s=300, started_at=0)
    for t, used in ((0, CONTEXT), (30, 60 * GIB), (90, 120 * GIB), (200, 119 * GIB)):
        risk = planner.observe(used, used - CONTEXT, H200_TOTAL, now=t)
        assert risk.device == 0  # learning: nothing is beyond a plan not yet known
    later = planner.observe(130 * GIB, 129 * GIB, H200_TOTAL, now=400)
    assert later.settled and later.planned_used_bytes == 120 * GIB
    assert later.device == pytest.approx(10 / 20.54, rel=1e-3)


def test_risk_is_bounded_and_a_full_plan_still_has_a_margin() -> None:
    assert risk_ratio(50, planned=100, margin=40) == 0.0
    assert risk_ratio(500, planned=100, margin=40) == 1.0
    planner = MemoryPlanner(MemoryBudget(H200_TOTAL, 0), settle_s=0, started_at=0)
    risk = planner.observe(H200_TOTAL - GIB, H200_TOTAL - GIB, H200_TOTAL, now=1)
    assert risk.margin_bytes == int(0.01 * H200_TOTAL) and risk.device == 0.0


@settings(max_examples=40, deadline=None)
@given(
    period_s=st.floats(min_value=0.2, max_value=120),
    duty=st.floats(min_value=0.05, max_value=0.95),
    low=st.floats(min_value=0.0, max_value=0.74),
    high=st.floats(min_value=0.80, max_value=0.89),
)
def test_a_signal_oscillating_across_a_threshold_changes_level_at_most_six_times_a_minute(
    period_s: float, duty: float, low: float, high: float
) -> None:
    """Any square wave across the high threshold and out of its hysteresis band, at any period
    and duty cycle, sampled every 0.25 s for ten minutes: at most six changes in any minute."""
    mark = Watermark(WardenSettings().thresholds, 0.05, WardenSettings().watermark_hold_s)
    changes = []
    t = 0.0
    while t < 600:
        risk = high if (t % period_s) < duty * period_s else low
        if mark.update({"device": risk}, now=t) is not None:
            changes.append(t)
        t += 0.25
    worst = max((sum(1 for u in changes if s <= u < s + 60) for s in changes), default=0)
    assert worst <= 6
