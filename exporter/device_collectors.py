"""Collectors for the device-owning process: allocator, NVML and CUDA graphs.

They read through the adapters in ``exporter.adapters`` (GPU-only) and set warden metrics; the
signal publisher then turns this device's bytes into memory risk against the engine's plan
(exporter/memory_risk.py) and publishes it to the signal board, so the API process folds it
into the watermark on its next step. Counters mirror monotonic source counters by adding the
delta.

The ``device`` risk counts this engine's own processes on the device where NVML gives
per-process usage (``nvmlDeviceGetComputeRunningProcesses``): on a shared GPU a neighbour's
growth is not this engine's to relieve, and refusing or preempting its requests would not
free that memory. Where NVML does not say (no per-process figure, or the engine's pids are not
among the device's processes, as in a container that sees host pids), it counts every process
on the device. ``warden_memory_device_risk_scope{gpu}`` says which (1 engine, 0 device).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from exporter import catalog
from exporter.adapters import (
    AllocatorSource,
    AllocatorStats,
    CudaGraphSource,
    DeviceMemory,
    DeviceMemorySource,
)
from exporter.memory_risk import MemoryBudget, MemoryPlanner, MemoryRisk
from exporter.metrics import WardenMetrics
from exporter.signals import SignalBoard

DEVICE_SCOPE, ENGINE_SCOPE = "device", "engine"  # what the device risk counts


class _CounterMirror:
    """Turns a monotonic source value into Counter increments (sources reset on restart)."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def delta(self, key: str, value: int) -> int:
        previous = self._last.get(key)
        self._last[key] = value
        if previous is None or value < previous:
            return value
        return value - previous


class AllocatorCollector:
    name = "torch_allocator"

    def __init__(self, source: AllocatorSource, device_index: int, metrics: WardenMetrics) -> None:
        self.source = source
        self.device_index = device_index
        self.device = f"cuda:{device_index}"
        self._allocated = metrics.get(catalog.TORCH_ALLOCATED).labels(self.device)
        self._reserved = metrics.get(catalog.TORCH_RESERVED).labels(self.device)
        self._total = metrics.get(catalog.TORCH_DEVICE_TOTAL).labels(self.device)
        self._retries = metrics.get(catalog.TORCH_ALLOC_RETRIES).labels(self.device)
        self._ooms = metrics.get(catalog.TORCH_OOM).labels(self.device)
        self._mirror = _CounterMirror()
        self.reserved_ratio: float | None = None
        self.stats: AllocatorStats | None = None  # the latest read

    def collect(self) -> None:
        stats = self.source.read(self.device_index)
        self.stats = stats
        self._allocated.set(stats.allocated_bytes)
        self._reserved.set(stats.reserved_bytes)
        self._total.set(stats.total_bytes)
        self._retries.inc(self._mirror.delta("retries", stats.alloc_retries))
        self._ooms.inc(self._mirror.delta("ooms", stats.ooms))
        if stats.total_bytes > 0:
            self.reserved_ratio = stats.reserved_bytes / stats.total_bytes


class NvmlCollector:
    name = "nvml"

    def __init__(
        self,
        source: DeviceMemorySource,
        metrics: WardenMetrics,
        engine_pids: Callable[[], Collection[int]] = tuple,
    ) -> None:
        self.source = source
        self.engine_pids = engine_pids  # this engine's processes, read again at every collect
        self._used = metrics.get(catalog.GPU_MEMORY_USED)
        self._engine_used = metrics.get(catalog.GPU_MEMORY_ENGINE_USED)
        self._total = metrics.get(catalog.GPU_MEMORY_TOTAL)
        self.used_ratio: float | None = None
        # The latest read of each visible device, in CUDA order: position i is cuda:i.
        self.devices: list[tuple[int, DeviceMemory]] = []

    def collect(self) -> None:
        worst = 0.0
        devices = []
        pids = self.engine_pids()
        for index in self.source.device_indices():
            memory = self.source.read(index, pids)
            devices.append((index, memory))
            self._used.labels(str(index)).set(memory.used_bytes)
            if memory.engine_bytes is not None:
                self._engine_used.labels(str(index)).set(memory.engine_bytes)
            self._total.labels(str(index)).set(memory.total_bytes)
            if memory.total_bytes > 0:
                worst = max(worst, memory.used_bytes / memory.total_bytes)
        self.devices = devices
        self.used_ratio = worst

    def device(self, position: int) -> tuple[int, DeviceMemory] | None:
        """(NVML index, memory) of the ``position``-th visible device, as CUDA numbers it."""
        return self.devices[position] if 0 <= position < len(self.devices) else None


class CudaGraphCollector:
    name = "cudagraph"

    def __init__(self, source: CudaGraphSource, metrics: WardenMetrics) -> None:
        self.source = source
        self._captures = metrics.get(catalog.CUDAGRAPH_CAPTURES)
        self._pool = metrics.get(catalog.CUDAGRAPH_POOL_BYTES)
        self._mirror = _CounterMirror()

    def collect(self) -> None:
        self._captures.inc(self._mirror.delta("captures", self.source.captures()))
        self._pool.set(self.source.pool_bytes())


class SignalPublisher:
    """This rank's memory risk against the engine's plan, on the board and on /metrics.

    Runs after the allocator and NVML collectors, reading what they just read for this rank's
    device (``allocator.device_index``, else ``rank``): NVML's used bytes for the ``device``
    risk (this engine's processes where NVML says, else the whole device), PyTorch's reserved
    bytes for the ``allocator`` risk. A source that is missing leaves its risk NaN on the board
    (not measured), never 0.

    The two device scopes have different plans: the whole device's starts from what was in use
    before vLLM allocated (neighbours included), the engine's from nothing. Each has its own
    planner, made when its scope is first seen.
    """

    name = "signal_board"

    def __init__(
        self,
        board: SignalBoard,
        rank: int,
        allocator: AllocatorCollector | None,
        nvml: NvmlCollector | None,
        planner: MemoryPlanner | None = None,
        metrics: WardenMetrics | None = None,
        clock: Callable[[], float] = time.time,
        settle_s: float = 300.0,
    ) -> None:
        self.board = board
        self.rank = rank
        self.allocator = allocator
        self.nvml = nvml
        self.clock = clock
        self.planner = planner or MemoryPlanner(MemoryBudget(), settle_s, clock())
        self._planners = {DEVICE_SCOPE: self.planner}
        self.scope = DEVICE_SCOPE
        self.position = allocator.device_index if allocator is not None else rank
        self.risk: MemoryRisk | None = None
        self._metrics = metrics

    def _planner(self, scope: str) -> MemoryPlanner:
        if scope not in self._planners:
            first = self.planner
            budget = MemoryBudget(first.budget.budget_bytes, 0)  # the engine's own: from 0
            self._planners[scope] = MemoryPlanner(budget, first.settle_s, first.started_at)
        return self._planners[scope]

    def _bytes(self) -> tuple[int | None, int | None, int | None, str]:
        """(used, reserved, total, gpu label) of this rank's device, None where unknown."""
        used = reserved = total = None
        gpu = str(self.position)
        device = self.nvml.device(self.position) if self.nvml is not None else None
        self.scope = DEVICE_SCOPE
        if device is not None:
            index, memory = device
            used, total, gpu = memory.used_bytes, memory.total_bytes, str(index)
            if memory.engine_bytes is not None:
                used, self.scope = memory.engine_bytes, ENGINE_SCOPE
        stats = self.allocator.stats if self.allocator is not None else None
        if stats is not None:
            reserved = stats.reserved_bytes
            total = total or stats.total_bytes
        return used, reserved, total, gpu

    def collect(self) -> None:
        now = self.clock()
        used, reserved, total, gpu = self._bytes()
        nan = float("nan")
        if not total:
            self.board.write(self.rank, nan, nan, now)
            return
        risk = self._planner(self.scope).observe(used, reserved, total, now)
        self.risk = risk
        self.board.write(
            self.rank,
            nan if risk.device is None else risk.device,
            nan if risk.allocator is None else risk.allocator,
            now,
        )
        if self._metrics is not None:
            self._publish(risk, used, reserved, total, gpu)

    def _publish(
        self, risk: MemoryRisk, used: int | None, reserved: int | None, total: int, gpu: str
    ) -> None:
        metrics = self._metrics
        assert metrics is not None
        metrics.get(catalog.MEMORY_PLANNED).labels(gpu).set(risk.planned_used_bytes)
        scope = 1 if self.scope == ENGINE_SCOPE else 0
        metrics.get(catalog.MEMORY_DEVICE_RISK_SCOPE).labels(gpu).set(scope)
        for source, value in risk.signals().items():
            metrics.get(catalog.MEMORY_RISK).labels(source).set(value)
        ratio = metrics.get(catalog.MEMORY_UTILIZATION)
        if used is not None:
            ratio.labels("device").set(used / total)
        if reserved is not None:
            ratio.labels("torch_reserved").set(reserved / total)
