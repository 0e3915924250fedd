"""Exporter logic, tested in-process. GPU-only sources are replaced by FAKES of their adapters
(FakeAllocator, FakeNvml, FakeCudaGraphs below): this machine has no GPU. The real adapters
(exporter/adapters.py) call torch.cuda / NVML / vLLM and run only where a GPU is present."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import pytest
import torch
from prometheus_client import REGISTRY, CollectorRegistry
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate
from vllm.v1.sample.logits_processor.interface import MoveDirectionality

from exporter import catalog
from exporter.adapters import AllocatorStats, DeviceMemory, NvmlDevices, TorchCudaAllocator
from exporter.collectors import CollectorRunner, FailingCollector
from exporter.device_collectors import (
    AllocatorCollector,
    CudaGraphCollector,
    NvmlCollector,
    SignalPublisher,
)
from exporter.errors import classify_exception
from exporter.logits import NonFiniteLogitsProcessor
from exporter.memory_risk import MemoryBudget, MemoryPlanner
from exporter.metrics import WardenMetrics
from exporter.settings import SettingsError, WardenSettings, load_settings
from exporter.signals import SignalBoard
from exporter.stall import StallCollector
from exporter.step_monitor import StepMonitor
from exporter.watermark import CRITICAL, HIGH, NORMAL, OOM_IMMINENT, Watermark


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> WardenMetrics:
    return WardenMetrics(registry)


# --- watermark ------------------------------------------------------------------------------


def test_watermark_rises_at_once_to_the_worst_signal() -> None:
    mark = Watermark((0.80, 0.90, 0.97), hysteresis=0.05, hold_s=20)
    assert mark.update({"device": 0.5}, now=0) is None
    change = mark.update({"device": 0.5, "allocator": 0.93}, now=1)
    assert change is not None and change.entered == "critical"
    assert (change.source, change.value) == ("allocator", 0.93)
    assert mark.worst_source == "allocator"
    assert mark.update({"device": 0.99}, now=2).entered == "oom_imminent"  # type: ignore[union-attr]


def test_watermark_hysteresis_and_hold_prevent_flapping_on_a_threshold() -> None:
    mark = Watermark((0.80, 0.90, 0.97), hysteresis=0.05, hold_s=20)
    mark.update({"device": 0.81}, now=0)
    levels = []
    for second, risk in enumerate((0.799, 0.805, 0.76, 0.802, 0.77), start=1):
        mark.update({"device": risk}, now=second)
        levels.append(mark.level)
    assert levels == [HIGH] * 5  # inside the band (0.80 - 0.05), or not below it long enough
    mark.update({"device": 0.70}, now=10)
    assert mark.level == HIGH  # below the band, but not for the hold yet
    mark.update({"device": 0.72}, now=29)
    assert mark.level == HIGH
    mark.update({"device": 0.74}, now=30)
    assert mark.level == NORMAL  # 20 s below the band without a break


def test_watermark_steps_down_only_as_far_as_the_signal_allows() -> None:
    mark = Watermark((0.80, 0.90, 0.97), hysteresis=0.05, hold_s=20)
    mark.update({"device": 1.0}, now=0)
    assert mark.level == OOM_IMMINENT
    mark.update({"device": 0.93}, now=1)  # inside oom_imminent's band (0.97 - 0.05): held
    mark.update({"device": 0.93}, now=30)
    assert mark.level == OOM_IMMINENT
    mark.update({"device": 0.91}, now=31)  # critical, not oom_imminent even with the band
    mark.update({"device": 0.91}, now=51)
    assert mark.level == CRITICAL
    mark.update({"device": 0.84}, now=52)
    mark.update({"device": 0.84}, now=72)
    assert mark.level == HIGH
    mark.update({}, now=73)  # no signal at all (a CPU engine): nothing at risk
    mark.update({}, now=93)
    assert mark.level == NORMAL


# --- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"WARDEN_WATERMARK_HIGH": "abc"}, "WARDEN_WATERMARK_HIGH"),
        ({"WARDEN_WATERMARK_HIGH": "1.5"}, "WARDEN_WATERMARK_HIGH"),
        ({"WARDEN_WATERMARK_CRITICAL": "0.5"}, "WARDEN_WATERMARK_CRITICAL"),
        ({"WARDEN_WATERMARK_HOLD_S": "-1"}, "WARDEN_WATERMARK_HOLD_S"),
        ({"WARDEN_MEMORY_SETTLE_S": "soon"}, "WARDEN_MEMORY_SETTLE_S"),
        ({"WARDEN_STALL_TIMEOUT_S": "-1"}, "WARDEN_STALL_TIMEOUT_S"),
        ({"WARDEN_COLLECTOR_INTERVAL_S": "0"}, "WARDEN_COLLECTOR_INTERVAL_S"),
        ({"WARDEN_WATERMARK_HYSTERESIS": "0.95"}, "WARDEN_WATERMARK_HYSTERESIS"),
        ({"WARDEN_TEST_INJECT_NONFINITE": "maybe"}, "WARDEN_TEST_INJECT_NONFINITE"),
        ({"WARDEN_TEST_STEP_DELAY_S": "500"}, "WARDEN_TEST_STEP_DELAY_S"),
        # read by the readiness checks: a bad value used to fall back silently
        ({"WARDEN_READY_MAX_ERROR_RATE": "half"}, "WARDEN_READY_MAX_ERROR_RATE"),
        ({"WARDEN_READY_MIN_REQUESTS": "0"}, "WARDEN_READY_MIN_REQUESTS"),
        ({"WARDEN_HEALTH_SAMPLE_S": "0"}, "WARDEN_HEALTH_SAMPLE_S"),
        ({"WARDEN_WEBHOOK_INSECURE": "perhaps"}, "WARDEN_WEBHOOK_INSECURE"),
        ({"WARDEN_PORT": "99999"}, "WARDEN_PORT"),
    ],
)
def test_absurd_config_is_refused_naming_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        load_settings(env)


def test_settings_error_shows_the_value_given() -> None:
    with pytest.raises(SettingsError, match="WARDEN_WATERMARK_HIGH='abc'"):
        load_settings({"WARDEN_WATERMARK_HIGH": "abc"})


def test_settings_come_from_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARDEN_STALL_TIMEOUT_S", "7")
    monkeypatch.setenv("WARDEN_WATERMARK_HIGH", "")  # empty counts as unset
    settings = load_settings()
    assert settings.stall_timeout_s == 7 and settings.watermark_high == 0.80
    monkeypatch.setenv("WARDEN_STALL_TIMEOUT_S", "soon")
    with pytest.raises(SettingsError, match="WARDEN_STALL_TIMEOUT_S='soon'"):
        load_settings()


def test_config_defaults_and_overrides() -> None:
    assert load_settings({}).thresholds == (0.80, 0.90, 0.97)
    config = load_settings({"WARDEN_WATERMARK_HIGH": "0.7", "WARDEN_STALL_TIMEOUT_S": "5"})
    assert config.watermark_high == 0.7 and config.stall_timeout_s == 5
    assert config.test_step_delay_s == 0.0  # production steps are never slowed


# --- error classes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "cuda_driver"),
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), "cuda_driver"),
        (RuntimeError("CUDA error: unspecified launch failure"), "cuda_driver"),
        (ValueError("shape mismatch"), "other"),
    ],
)
def test_engine_errors_are_classified(exc: BaseException, expected: str) -> None:
    assert classify_exception(exc) == expected


def test_wrapped_worker_oom_is_still_an_oom() -> None:
    try:
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        except Exception as inner:
            raise RuntimeError("Worker failed with error") from inner
    except RuntimeError as outer:
        assert classify_exception(outer) == "oom"


# --- collectors -----------------------------------------------------------------------------


class CountingCollector:
    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> None:
        self.calls += 1


def test_failing_collector_is_counted_and_skipped(
    metrics: WardenMetrics, registry: CollectorRegistry
) -> None:
    healthy = CountingCollector()
    runner = CollectorRunner([FailingCollector(), healthy], metrics, interval_s=0.01)
    for _ in range(3):
        runner.run_once()
    assert value(registry, catalog.COLLECTOR_ERRORS.name, collector="test_failing") == 3
    assert value(registry, catalog.COLLECTOR_ERRORS.name, collector="counting") == 0
    assert healthy.calls == 3


def test_runner_thread_keeps_going_and_stops(metrics: WardenMetrics) -> None:
    healthy = CountingCollector()
    runner = CollectorRunner([FailingCollector(), healthy], metrics, interval_s=0.01)
    runner.start()
    deadline = threading.Event()
    deadline.wait(0.2)
    runner.stop()
    assert healthy.calls >= 3


class FakeAllocator:
    """FAKE of exporter.adapters.TorchCudaAllocator (no GPU here)."""

    def __init__(self) -> None:
        self.stats = AllocatorStats(2 << 30, 6 << 30, 8 << 30, alloc_retries=0, ooms=0)

    def availability(self) -> str | None:
        return None

    def read(self, device_index: int) -> AllocatorStats:
        return self.stats


class FakeNvml:
    """FAKE of exporter.adapters.NvmlDevices (no NVIDIA driver here)."""

    def __init__(self) -> None:
        self.memory = {0: DeviceMemory(7 << 30, 8 << 30), 1: DeviceMemory(1 << 30, 8 << 30)}

    def availability(self) -> str | None:
        return None

    def device_indices(self) -> list[int]:
        return sorted(self.memory)

    def read(self, index: int, engine_pids: object = ()) -> DeviceMemory:
        return self.memory[index]


class FakeCudaGraphs:
    """FAKE of exporter.adapters.VllmCudaGraphs (no CUDA graphs on CPU)."""

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0

    def availability(self) -> str | None:
        return None

    def captures(self) -> int:
        return self.count

    def pool_bytes(self) -> int:
        return self.bytes


def test_allocator_collector_exports_gap_inputs_and_counts_deltas(
    metrics: WardenMetrics, registry: CollectorRegistry
) -> None:
    fake = FakeAllocator()
    collector = AllocatorCollector(fake, 0, metrics)
    collector.collect()
    assert value(registry, catalog.TORCH_ALLOCATED.name, device="cuda:0") == 2 << 30
    assert value(registry, catalog.TORCH_RESERVED.name, device="cuda:0") == 6 << 30
    assert value(registry, catalog.TORCH_DEVICE_TOTAL.name, device="cuda:0") == 8 << 30
    assert collector.reserved_ratio == pytest.approx(0.75)
    fake.stats = AllocatorStats(2 << 30, 7 << 30, 8 << 30, alloc_retries=3, ooms=1)
    collector.collect()
    fake.stats = AllocatorStats(2 << 30, 7 << 30, 8 << 30, alloc_retries=5, ooms=1)
    collector.collect()
    assert value(registry, catalog.TORCH_ALLOC_RETRIES.name, device="cuda:0") == 5
    assert value(registry, catalog.TORCH_OOM.name, device="cuda:0") == 1


def test_nvml_collector_reports_each_gpu_and_the_worst_ratio(
    metrics: WardenMetrics, registry: CollectorRegistry
) -> None:
    collector = NvmlCollector(FakeNvml(), metrics)
    collector.collect()
    assert value(registry, catalog.GPU_MEMORY_USED.name, gpu="0") == 7 << 30
    assert value(registry, catalog.GPU_MEMORY_TOTAL.name, gpu="1") == 8 << 30
    assert collector.used_ratio == pytest.approx(7 / 8)


def test_cudagraph_collector_counts_captures_and_pool(
    metrics: WardenMetrics, registry: CollectorRegistry
) -> None:
    fake = FakeCudaGraphs()
    collector = CudaGraphCollector(fake, metrics)
    fake.count, fake.bytes = 35, 512 << 20
    collector.collect()
    fake.count = 37
    collector.collect()
    assert value(registry, catalog.CUDAGRAPH_CAPTURES.name) == 37
    assert value(registry, catalog.CUDAGRAPH_POOL_BYTES.name) == 512 << 20


class FakePynvml:
    """FAKE of the pynvml module (no NVIDIA driver here): one 80 GiB GPU shared by this engine's
    processes and a neighbour's, per-process usage as NVML reports it."""

    TOTAL = 80 << 30
    CONTEXT = 1 << 29  # driver and contexts: in NVML's "used", in no process's figure

    def __init__(self, processes: dict[int, int | None]) -> None:
        self.processes = processes  # pid -> usedGpuMemory (None: NVML cannot tell)

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        used = self.CONTEXT + sum(b or 0 for b in self.processes.values())
        return SimpleNamespace(used=used, total=self.TOTAL)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.processes.items()]


def nvml_devices(fake: FakePynvml) -> NvmlDevices:
    """The real adapter over the fake module."""
    devices = NvmlDevices.__new__(NvmlDevices)
    devices._nvml, devices._reason = fake, None
    return devices


def test_device_risk_counts_this_engines_processes_on_a_shared_gpu(
    metrics: WardenMetrics, registry: CollectorRegistry, tmp_path
) -> None:
    """An engine (pids 100, 101) planned at 40 GiB of an 80 GiB GPU that a neighbour (pid 900)
    shares. The neighbour growing to 38 GiB fills the device (device-wide risk 0.93, critical),
    but this engine is within its plan: normal, and the scope gauge says the engine is counted.
    This engine growing beyond its plan still reads high."""
    path = str(tmp_path / "board")
    board = SignalBoard(path, create=True)
    fake = FakePynvml({100: 1 << 30, 101: 39 << 30, 900: 10 << 30})
    nvml = NvmlCollector(nvml_devices(fake), metrics, lambda: {100, 101})
    planner = MemoryPlanner(MemoryBudget(40 << 30, FakePynvml.CONTEXT + (10 << 30)), 0, 0)
    publisher = SignalPublisher(board, 0, None, nvml, planner, metrics)
    runner = CollectorRunner([nvml, publisher], metrics, 1.0)
    monitor = StepMonitor(WardenSettings(), metrics, SignalBoard(path))
    runner.run_once()
    assert value(registry, catalog.GPU_MEMORY_ENGINE_USED.name, gpu="0") == 40 << 30
    assert value(registry, catalog.MEMORY_DEVICE_RISK_SCOPE.name, gpu="0") == 1
    fake.processes[900] = 38 << 30  # the neighbour grows: the device is 97% used
    runner.run_once()
    snap = monitor.on_step(running=2, waiting=0, kv_usage=1.0)
    assert snap.signals == {"device": 0.0} and snap.watermark == NORMAL
    fake.processes[101] = 73 << 30  # this engine grows 34 GiB beyond its 40 GiB plan
    runner.run_once()
    snap = monitor.on_step(running=2, waiting=0, kv_usage=1.0)
    assert snap.signals["device"] == pytest.approx(34 / 40) and snap.watermark == HIGH


@pytest.mark.parametrize(
    "processes",
    [{100: None, 900: 38 << 30}, {4100: 40 << 30, 900: 38 << 30}],
    ids=["no_per_process_figure", "pids_not_seen"],
)
def test_device_risk_counts_the_whole_device_where_nvml_cannot_say(
    metrics: WardenMetrics, registry: CollectorRegistry, tmp_path, processes: dict
) -> None:
    """NVML gives no per-process usage, or none of the engine's pids among the device's (a
    container seeing host pids): every process counts, and the scope gauge says so."""
    board = SignalBoard(str(tmp_path / "board"), create=True)
    fake = FakePynvml(processes)
    nvml = NvmlCollector(nvml_devices(fake), metrics, lambda: {100})
    planner = MemoryPlanner(MemoryBudget(40 << 30, FakePynvml.CONTEXT), 0, 0)
    publisher = SignalPublisher(board, 0, None, nvml, planner, metrics)
    CollectorRunner([nvml, publisher], metrics, 1.0).run_once()
    assert value(registry, catalog.MEMORY_DEVICE_RISK_SCOPE.name, gpu="0") == 0
    assert value(registry, catalog.GPU_MEMORY_ENGINE_USED.name, gpu="0") is None
    used = FakePynvml.CONTEXT + sum(b or 0 for b in processes.values())
    planned = FakePynvml.CONTEXT + (40 << 30)  # the whole device's plan: what was in use + budget
    expected = max(0.0, (used - planned) / (FakePynvml.TOTAL - planned))
    assert publisher.risk is not None and publisher.risk.device == pytest.approx(expected)


def test_device_risk_reaches_the_api_side_watermark(
    metrics: WardenMetrics, registry: CollectorRegistry, tmp_path
) -> None:
    """Worker side: bytes -> risk against the plan -> board and /metrics. API side: the board
    -> watermark. A device planned at 6 GiB of 8 (budget 5.5 GiB + 0.5 GiB in use before)."""
    path = str(tmp_path / "board")
    writer_board = SignalBoard(path, create=True)
    fake = FakeAllocator()
    nvml = FakeNvml()
    nvml.memory = {0: DeviceMemory(6 << 30, 8 << 30)}
    allocator = AllocatorCollector(fake, 0, metrics)
    nvml_collector = NvmlCollector(nvml, metrics)
    planner = MemoryPlanner(MemoryBudget(int(5.5 * 2**30), 1 << 29), settle_s=0, started_at=0)
    publisher = SignalPublisher(writer_board, 0, allocator, nvml_collector, planner, metrics)
    runner = CollectorRunner([allocator, nvml_collector, publisher], metrics, 1.0)
    runner.run_once()
    monitor = StepMonitor(WardenSettings(), metrics, SignalBoard(path))
    snap = monitor.on_step(running=2, waiting=0, kv_usage=1.0)  # a full KV cache: no risk
    assert snap.signals == {"device": 0.0, "allocator": pytest.approx(0.25)}
    assert snap.watermark == NORMAL
    assert value(registry, catalog.MEMORY_PLANNED.name, gpu="0") == 6 << 30
    assert value(registry, catalog.MEMORY_UTILIZATION.name, source="device") == 0.75
    # The device fills beyond the plan: 7.9 of 8 GiB, 95% of the 2 GiB margin gone.
    nvml.memory = {0: DeviceMemory(int(7.9 * 2**30), 8 << 30)}
    runner.run_once()
    snap = monitor.on_step(running=2, waiting=0, kv_usage=0.3)
    assert snap.watermark == CRITICAL and snap.watermark_source == "device"
    assert value(registry, catalog.MEMORY_WATERMARK.name) == CRITICAL
    assert value(registry, catalog.MEMORY_RISK.name, source="device") == pytest.approx(0.95)
    assert value(registry, catalog.WATERMARK_TRANSITIONS.name, to="critical") == 1
    fake.stats = AllocatorStats(1, 8 << 30, 8 << 30, 0, 0)  # reserved = total
    runner.run_once()
    assert monitor.on_step(running=2, waiting=0, kv_usage=0.3).watermark == OOM_IMMINENT


def test_stale_board_slots_are_ignored(tmp_path) -> None:
    board = SignalBoard(str(tmp_path / "b"), create=True)
    board.write(0, 0.99, 0.99, timestamp=100.0)
    assert board.read_max(max_age_s=5, now=200.0) == {}
    board.write(1, math.nan, 0.5, timestamp=199.0)
    assert board.read_max(max_age_s=5, now=200.0) == {"allocator": 0.5}


def test_real_adapters_report_unavailable_on_a_cpu_machine() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the real adapters are exercised instead")
    assert TorchCudaAllocator().availability() is not None
    assert NvmlDevices().availability() is not None


# --- step monitor and stall -----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_stall_needs_pending_work_and_no_step(
    metrics: WardenMetrics, registry: CollectorRegistry
) -> None:
    clock = Clock()
    monitor = StepMonitor(WardenSettings(), metrics, None, clock=clock)
    stall = StallCollector(monitor, metrics, timeout_s=30, clock=clock)
    clock.now += 100
    stall.collect()  # idle engine for 100 s: not a stall
    assert value(registry, catalog.ENGINE_STALLED.name) == 0
    monitor.on_step(running=1, waiting=3, kv_usage=0.1)
    clock.now += 20
    stall.collect()
    assert value(registry, catalog.ENGINE_STALLED.name) == 0
    clock.now += 15
    stall.collect()
    assert value(registry, catalog.ENGINE_STALLED.name) == 1
    monitor.on_step(running=1, waiting=0, kv_usage=0.1)  # a step completes: recovered
    stall.collect()
    assert value(registry, catalog.ENGINE_STALLED.name) == 0


def test_requests_arriving_on_an_idle_engine_that_never_steps_is_a_stall(
    metrics: WardenMetrics, registry: CollectorRegistry
) -> None:
    clock = Clock()
    monitor = StepMonitor(WardenSettings(), metrics, None, clock=clock)
    inflight = {"n": 0}
    monitor.inflight = lambda: inflight["n"]
    stall = StallCollector(monitor, metrics, timeout_s=10, clock=clock)
    clock.now += 500
    stall.collect()
    inflight["n"] = 2  # requests arrive; the engine (paused) never reports a step
    clock.now += 5
    stall.collect()
    assert value(registry, catalog.ENGINE_STALLED.name) == 0
    clock.now += 6
    stall.collect()
    assert value(registry, catalog.ENGINE_STALLED.name) == 1


def test_failing_step_listener_is_counted_not_raised(
    metrics: WardenMetrics, registry: CollectorRegistry
) -> None:
    monitor = StepMonitor(WardenSettings(), metrics, None)

    class Broken:
        name = "broken_listener"

        def __call__(self, snap: object) -> None:
            raise RuntimeError("boom")

    monitor.add_listener(Broken())
    monitor.on_step(1, 0, 0.5)
    assert value(registry, catalog.COLLECTOR_ERRORS.name, collector="broken_listener") == 1


# --- logits processor (real class, CPU tensors) ---------------------------------------------


def nonfinite_total(kind: str) -> float:
    return REGISTRY.get_sample_value(catalog.NONFINITE_LOGITS.name, {"kind": kind}) or 0.0


def test_logits_processor_counts_each_bad_request_once(monkeypatch: pytest.MonkeyPatch) -> None:
    processor = NonFiniteLogitsProcessor(None, torch.device("cpu"), False)
    before = {k: nonfinite_total(k) for k in catalog.NONFINITE_KINDS}
    params = [SamplingParams(max_tokens=8) for _ in range(3)]
    processor.update_state(
        BatchUpdate(3, removed=[], added=[(i, p, [], []) for i, p in enumerate(params)], moved=[])
    )
    for _ in range(3):  # the bad rows stay bad for three steps: still one count each
        logits = torch.zeros(3, 16)
        logits[1, 4] = float("nan")
        logits[2, 0] = float("inf")
        assert processor.apply(logits) is logits
    # Rows 1 and 2 swap: the request identities move with them.
    processor.update_state(BatchUpdate(3, [], [], [(1, 2, MoveDirectionality.SWAP)]))
    logits = torch.zeros(3, 16)
    logits[2, 4] = float("nan")
    processor.apply(logits)
    after = {k: nonfinite_total(k) - before[k] for k in catalog.NONFINITE_KINDS}
    assert after == {"nan": 1.0, "inf": 1.0}


def test_logits_injection_needs_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    params = SamplingParams(max_tokens=8, extra_args={"warden_inject": "inf"})
    monkeypatch.delenv("WARDEN_TEST_INJECT_NONFINITE", raising=False)
    off = NonFiniteLogitsProcessor(None, torch.device("cpu"), False)
    off.update_state(BatchUpdate(1, [], [(0, params, [], [])], []))
    assert torch.isfinite(off.apply(torch.zeros(1, 8))).all()
    monkeypatch.setenv("WARDEN_TEST_INJECT_NONFINITE", "1")
    on = NonFiniteLogitsProcessor(None, torch.device("cpu"), False)
    on.update_state(BatchUpdate(1, [], [(0, params, [], [])], []))
    assert torch.isinf(on.apply(torch.zeros(1, 8))).all()
    retried = SamplingParams(max_tokens=8, extra_args={"warden_inject": "inf", "warden_attempt": 2})
    on.update_state(BatchUpdate(1, [0], [(0, retried, [], [])], []))
    assert torch.isfinite(on.apply(torch.zeros(1, 8))).all()


def test_watermark_peak_holds_a_short_spike_for_the_window(
    metrics: WardenMetrics, registry: CollectorRegistry, tmp_path
) -> None:
    clock = Clock()
    settings = WardenSettings(watermark_peak_window_s=15, watermark_hold_s=0)
    board = SignalBoard(str(tmp_path / "board"), create=True)
    monitor = StepMonitor(settings, metrics, board, clock=clock)
    board.write(0, 0.99, math.nan, clock.now)
    monitor.on_step(running=8, waiting=0, kv_usage=0.99)  # spike to oom_imminent
    clock.now += 1
    board.write(0, 0.1, math.nan, clock.now)
    monitor.on_step(running=1, waiting=0, kv_usage=0.1)  # the reflex relieved it at once
    assert value(registry, catalog.MEMORY_WATERMARK.name) == NORMAL
    assert value(registry, catalog.MEMORY_WATERMARK_PEAK.name) == OOM_IMMINENT
    clock.now += 14.5  # still inside the 15 s window (the spike ended 14.5 s ago)
    monitor.publish_peak(clock.now)
    assert value(registry, catalog.MEMORY_WATERMARK_PEAK.name) == OOM_IMMINENT
    clock.now += 1  # the collector thread lets it decay without any step
    monitor.publish_peak(clock.now)
    assert value(registry, catalog.MEMORY_WATERMARK_PEAK.name) == NORMAL
