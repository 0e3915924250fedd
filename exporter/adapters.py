"""Thin adapters over the GPU-only sources: PyTorch's CUDA allocator, NVML and CUDA graphs.

None of these can run on a CPU machine. Each adapter is the smallest possible wrapper around
the real API, so the logic above it (collectors) is tested against fakes of these classes and
the adapters themselves are exercised on a GPU when one is available. ``availability()`` says
whether the source can be read here, and if not, why, so the plugin can say so at start.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from types import ModuleType
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
    used_bytes: int  # every process on the device
    total_bytes: int
    # This engine's own processes on the device (NVML per process), None where NVML does not
    # say (no per-process figure, or none of the engine's pids among the device's processes:
    # a container that sees host pids, say).
    engine_bytes: int | None = None


class AllocatorSource(Protocol):
    def availability(self) -> str | None: ...  # None when available, else the reason
    def read(self, device_index: int) -> AllocatorStats: ...


class DeviceMemorySource(Protocol):
    def availability(self) -> str | None: ...
    def device_indices(self) -> list[int]: ...
    def read(self, index: int, engine_pids: Collection[int] = ()) -> DeviceMemory: ...


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

    def read(self, index: int, engine_pids: Collection[int] = ()) -> DeviceMemory:
        """The device's memory, and the part of it held by ``engine_pids`` where NVML says."""
        handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        engine = self._engine_bytes(handle, engine_pids) if engine_pids else None
        return DeviceMemory(int(info.used), int(info.total), engine)

    def _engine_bytes(self, handle: Any, engine_pids: Collection[int]) -> int | None:
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:  # not supported on this device or driver: the device view stays
            return None
        ours = [p for p in processes if int(p.pid) in engine_pids]
        # usedGpuMemory is None where NVML cannot tell (NVML_VALUE_NOT_AVAILABLE).
        if not ours or any(getattr(p, "usedGpuMemory", None) is None for p in ours):
            return None
        return sum(int(p.usedGpuMemory) for p in ours)


class VllmCudaGraphs:
    """CUDA graphs captured by vLLM at start-up: how many, and the device memory they took.

    vLLM captures graphs once, while the engine starts (``capture_model`` on the V1 runner,
    ``gpu_model_runner.GPUModelRunner``, or on Model Runner V2, ``gpu.model_runner``), and only
    logs the memory ("Graph capturing finished ... took X GiB"). ``install()`` wraps both
    runners' ``capture_model`` to keep the bytes it returns and to read vLLM's capture counter
    once capture has finished. Before that the counter moves during memory profiling (V2
    captures with ``profile_only=True``, V1 in ``profile_cudagraph_memory``) and is put back
    afterwards: reading it then would count graphs that were thrown away.
    """

    def __init__(self, device_type: str) -> None:
        self._device_type = device_type
        self._pool_bytes = 0
        self._captures = 0
        self.hooked: list[str] = []  # runner hook points wrapped here
        self.missing: dict[str, str] = {}  # hook point -> why it is not

    def availability(self) -> str | None:
        if self._device_type != "cuda":
            return f"CUDA graphs are not used on a {self._device_type} engine"
        return None

    def install(self, on_missing: Callable[[str], None]) -> None:
        """Wrap ``capture_model`` of the runner module(s) the worker imports (now, or when it
        imports them); raise if vLLM's capture counter is missing. ``on_missing(reason)`` is
        called for an imported runner whose ``capture_model`` is not there."""
        from exporter import import_hooks, vllm_compat

        counter_missing = vllm_compat.missing_hook(vllm_compat.HOOK_GRAPH_COUNTER)
        if counter_missing is not None:
            raise RuntimeError(counter_missing)

        def wrap_runner(module: ModuleType, point: vllm_compat.HookPoint) -> None:
            reason = vllm_compat.missing_hook(point, module)
            if reason is not None:
                self.missing[point.name] = reason
                on_missing(reason)
                return
            self._wrap(module.GPUModelRunner)
            self.hooked.append(point.name)

        for point in (vllm_compat.HOOK_CAPTURE_V1, vllm_compat.HOOK_CAPTURE_V2):
            import_hooks.when_imported(point.module, functools.partial(wrap_runner, point=point))

    def _wrap(self, runner_cls: Any) -> None:
        original = runner_cls.capture_model
        if getattr(original, "_warden_wrapped", False):
            return
        adapter = self

        @functools.wraps(original)
        def capture_model(runner: Any, *args: Any, **kwargs: Any) -> Any:
            taken = original(runner, *args, **kwargs)
            if not kwargs.get("profile_only", False):
                adapter.captured(int(taken or 0))
            return taken

        capture_model._warden_wrapped = True  # type: ignore[attr-defined]
        runner_cls.capture_model = capture_model

    def captured(self, pool_bytes: int) -> None:
        """A real capture finished: keep its bytes and the capture counter as it now stands."""
        from vllm.compilation.counter import compilation_counter

        self._pool_bytes += max(pool_bytes, 0)
        self._captures = int(compilation_counter.num_cudagraph_captured)

    def captures(self) -> int:
        return self._captures

    def pool_bytes(self) -> int:
        return self._pool_bytes
