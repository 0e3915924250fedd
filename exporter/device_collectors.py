"""Collectors for the device-owning process: allocator, NVML and CUDA graphs.

They read through the adapters in ``exporter.adapters`` (GPU-only), set warden metrics, and
publish the two memory ratios to the signal board so the API process can fold them into the
watermark on its next step. Counters mirror monotonic source counters by adding the delta.
"""

from __future__ import annotations

import time

from exporter import catalog
from exporter.adapters import AllocatorSource, CudaGraphSource, DeviceMemorySource
from exporter.metrics import WardenMetrics
from exporter.signals import SignalBoard


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

    def collect(self) -> None:
        stats = self.source.read(self.device_index)
        self._allocated.set(stats.allocated_bytes)
        self._reserved.set(stats.reserved_bytes)
        self._total.set(stats.total_bytes)
        self._retries.inc(self._mirror.delta("retries", stats.alloc_retries))
        self._ooms.inc(self._mirror.delta("ooms", stats.ooms))
        if stats.total_bytes > 0:
            self.reserved_ratio = stats.reserved_bytes / stats.total_bytes


class NvmlCollector:
    name = "nvml"

    def __init__(self, source: DeviceMemorySource, metrics: WardenMetrics) -> None:
        self.source = source
        self._used = metrics.get(catalog.GPU_MEMORY_USED)
        self._total = metrics.get(catalog.GPU_MEMORY_TOTAL)
        self.used_ratio: float | None = None

    def collect(self) -> None:
        worst = 0.0
        for index in self.source.device_indices():
            memory = self.source.read(index)
            self._used.labels(str(index)).set(memory.used_bytes)
            self._total.labels(str(index)).set(memory.total_bytes)
            if memory.total_bytes > 0:
                worst = max(worst, memory.used_bytes / memory.total_bytes)
        self.used_ratio = worst


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
    """Writes this rank's latest memory ratios to the board; runs after the collectors."""

    name = "signal_board"

    def __init__(
        self,
        board: SignalBoard,
        rank: int,
        allocator: AllocatorCollector | None,
        nvml: NvmlCollector | None,
    ) -> None:
        self.board = board
        self.rank = rank
        self.allocator = allocator
        self.nvml = nvml

    def collect(self) -> None:
        nan = float("nan")
        device = self.nvml.used_ratio if self.nvml and self.nvml.used_ratio is not None else nan
        reserved = (
            self.allocator.reserved_ratio
            if self.allocator and self.allocator.reserved_ratio is not None
            else nan
        )
        self.board.write(self.rank, device, reserved, time.time())
