"""Thin adapters over the GPU-only sources: PyTorch's CUDA allocator, NVML and CUDA graphs.

None of these can run on a CPU machine. Each adapter is the smallest possible wrapper around
the real API, so the logic above it (collectors) is tested against fakes of these classes and
the adapters themselves are exercised on a GPU when one is available. ``availability()`` says
whether the source can be read here, and if not, why, so the plugin can say so at start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class AllocatorStats:
    allocated_bytes: int
    reserved_bytes: int
    total_bytes: int
    alloc_retries: int
    ooms: int


@dataclass(frozen=True)
class DeviceMemory:
    used_bytes: int
    total_bytes: int


class AllocatorSource(Protocol):
    def availability(self) -> str | None: ...  # None when available, else the reason
    def read(self, device_index: int) -> AllocatorStats: ...


class DeviceMemorySource(Protocol):
    def availability(self) -> str | None: ...
    def device_indices(self) -> list[int]: ...
    def read(self, index: int) -> DeviceMemory: ...


class CudaGraphSource(Protocol):
    def availability(self) -> str | None: ...
    def captures(self) -> int: ...
    def pool_bytes(self) -> int: ...


class TorchCudaAllocator:
    """PyTorch's caching allocator statistics (host-side counters: no device sync)."""

    def availability(self) -> str | None:
        try:
            import torch
        except ImportError:
            return "torch is not installed"
        if not torch.cuda.is_available():
            return "no CUDA device in this process"
        return None

    def read(self, device_index: int) -> AllocatorStats:
        import torch

        stats = torch.cuda.memory_stats(device_index)
        _free, total = torch.cuda.mem_get_info(device_index)
        return AllocatorStats(
            allocated_bytes=int(stats.get("allocated_bytes.all.current", 0)),
            reserved_bytes=int(stats.get("reserved_bytes.all.current", 0)),
            total_bytes=int(total),
            alloc_retries=int(stats.get("num_alloc_retries", 0)),
            ooms=int(stats.get("num_ooms", 0)),
        )


class NvmlDevices:
    """Device memory from NVML: what every process on the GPU uses, not just this one."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._reason: str | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:  # library missing or no driver: both mean "not here"
            self._reason = f"NVML unavailable ({type(exc).__name__}: {exc})"

    def availability(self) -> str | None:
        return self._reason

    def device_indices(self) -> list[int]:
        count = int(self._nvml.nvmlDeviceGetCount())
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        if visible and all(part.strip().isdigit() for part in visible.split(",")):
            return [int(part) for part in visible.split(",") if int(part) < count]
        return list(range(count))

    def read(self, index: int) -> DeviceMemory:
        handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        return DeviceMemory(used_bytes=int(info.used), total_bytes=int(info.total))


class VllmCudaGraphs:
    """CUDA graph captures from vLLM's compilation counter, pool bytes from capture_model.

    vLLM only logs the memory its graphs took ("Graph capturing finished ... took X GiB");
    ``install()`` wraps ``GPUModelRunner.capture_model`` to keep the number it returns.
    """

    def __init__(self, device_type: str) -> None:
        self._device_type = device_type
        self._pool_bytes = 0

    def availability(self) -> str | None:
        if self._device_type != "cuda":
            return f"CUDA graphs are not used on a {self._device_type} engine"
        return None

    def install(self) -> None:
        from vllm.v1.worker import gpu_model_runner

        runner_cls = gpu_model_runner.GPUModelRunner
        original = runner_cls.capture_model
        if getattr(original, "_warden_wrapped", False):
            return
        adapter = self

        def capture_model(runner: Any) -> int:
            taken = original(runner)
            adapter._pool_bytes += max(int(taken or 0), 0)
            return taken

        capture_model._warden_wrapped = True  # type: ignore[attr-defined]
        runner_cls.capture_model = capture_model  # type: ignore[method-assign]

    def captures(self) -> int:
        from vllm.compilation.counter import compilation_counter

        return int(compilation_counter.num_cudagraph_captured)

    def pool_bytes(self) -> int:
        return self._pool_bytes
