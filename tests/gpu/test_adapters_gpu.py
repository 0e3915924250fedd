"""The real GPU adapters on a real GPU: PyTorch's caching allocator (bytes, retries, OOM count
after a forced out-of-memory), NVML, and a CUDA graph captured and replayed with its pool bytes
measured the way vLLM measures them. No fakes, no vLLM."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from exporter.adapters import NvmlDevices, TorchCudaAllocator
from tests.gpu.gpu_support import GIB, GPU, gpu_time_us

pytestmark = GPU


@pytest.fixture
def device() -> int:
    torch.cuda.empty_cache()
    return torch.cuda.current_device()


def test_allocator_bytes_follow_a_real_allocation(device: int, gpu_report: dict[str, Any]) -> None:
    allocator = TorchCudaAllocator()
    assert allocator.availability() is None
    before = allocator.read(device)
    block = torch.empty(GIB, dtype=torch.uint8, device=f"cuda:{device}")
    during = allocator.read(device)
    assert during.allocated_bytes - before.allocated_bytes >= GIB
    assert during.reserved_bytes >= during.allocated_bytes
    assert during.total_bytes == torch.cuda.mem_get_info(device)[1]
    del block
    after = allocator.read(device)
    assert after.allocated_bytes == before.allocated_bytes
    assert after.reserved_bytes >= before.allocated_bytes + GIB  # kept in the cache: the gap
    gpu_report.setdefault("allocator", {})["total_gib"] = round(during.total_bytes / GIB, 2)


def test_allocator_counts_a_retry_and_a_forced_out_of_memory(
    device: int, gpu_report: dict[str, Any]
) -> None:
    """Fill the device with 1 GiB blocks until CUDA refuses (one retry after flushing the cache,
    then one OOM), free them (they stay cached), then ask for 2 GiB: no cached block fits, the
    device is full of cache, so the allocator flushes it and retries, and this time succeeds."""
    allocator = TorchCudaAllocator()
    start = allocator.read(device)
    blocks = []
    with pytest.raises(torch.OutOfMemoryError):
        while True:
            blocks.append(torch.empty(GIB, dtype=torch.uint8, device=f"cuda:{device}"))
    filled = len(blocks)
    after_oom = allocator.read(device)
    assert after_oom.ooms == start.ooms + 1
    assert after_oom.alloc_retries >= start.alloc_retries + 1
    del blocks  # cached, still reserved
    big = torch.empty(2 * GIB, dtype=torch.uint8, device=f"cuda:{device}")
    after_retry = allocator.read(device)
    assert after_retry.alloc_retries == after_oom.alloc_retries + 1
    assert after_retry.ooms == after_oom.ooms  # the retry succeeded
    del big
    torch.cuda.empty_cache()
    gpu_report.setdefault("allocator", {}).update(
        {
            "blocks_of_1gib_before_oom": filled,
            "ooms_counted": after_oom.ooms - start.ooms,
            "retries_counted": after_retry.alloc_retries - start.alloc_retries,
        }
    )


def test_nvml_sees_this_process_allocate(device: int, gpu_report: dict[str, Any]) -> None:
    nvml = NvmlDevices()
    assert nvml.availability() is None, nvml.availability()
    indices = nvml.device_indices()
    assert indices
    index = indices[device] if device < len(indices) else indices[0]
    before = nvml.read(index)
    assert 0 < before.used_bytes < before.total_bytes
    block = torch.empty(4 * GIB, dtype=torch.uint8, device=f"cuda:{device}")
    block.fill_(1)
    torch.cuda.synchronize()
    during = nvml.read(index)
    assert during.used_bytes - before.used_bytes >= int(3.5 * GIB)
    del block
    torch.cuda.empty_cache()
    gpu_report["nvml"] = {
        "devices": len(indices),
        "total_gib": round(before.total_bytes / GIB, 2),
        "seen_gib_for_a_4gib_tensor": round((during.used_bytes - before.used_bytes) / GIB, 2),
    }


def test_nvml_counts_this_processs_own_memory(device: int, gpu_report: dict[str, Any]) -> None:
    """The engine's own usage (NVML per process, what the device risk counts on a shared GPU):
    a 4 GiB tensor shows in this process's figure. Where NVML lists no process with this pid
    (a container that sees host pids), the adapter says so with None: the risk then counts the
    whole device."""
    nvml = NvmlDevices()
    assert nvml.availability() is None, nvml.availability()
    indices = nvml.device_indices()
    index = indices[device] if device < len(indices) else indices[0]
    torch.empty(1, device=f"cuda:{device}")  # this process holds a context on the device
    before = nvml.read(index, {os.getpid()})
    block = torch.empty(4 * GIB, dtype=torch.uint8, device=f"cuda:{device}")
    block.fill_(1)
    torch.cuda.synchronize()
    during = nvml.read(index, {os.getpid()})
    del block
    torch.cuda.empty_cache()
    assert nvml.read(index, {1 << 30}).engine_bytes is None  # a pid on no device
    if before.engine_bytes is None:
        assert during.engine_bytes is None
        gpu_report.setdefault("nvml", {})["engine_view"] = "no per-process figure for this pid"
        return
    assert during.engine_bytes is not None
    assert during.engine_bytes - before.engine_bytes >= int(3.5 * GIB)
    assert during.engine_bytes <= during.used_bytes
    gpu_report.setdefault("nvml", {})["engine_view"] = (
        f"this process: {round(during.engine_bytes / GIB, 2)} GiB with a 4 GiB tensor"
    )


def test_cuda_graph_capture_and_replay_with_pool_bytes(
    device: int, gpu_report: dict[str, Any]
) -> None:
    """A graph captured after warm-up, as vLLM does; its pool measured as vLLM's capture_model
    measures it (free device memory before minus after) and seen in reserved bytes."""
    allocator = TorchCudaAllocator()
    cuda = torch.device(f"cuda:{device}")
    weight = torch.randn(4096, 4096, device=cuda)
    static_in = torch.randn(256, 4096, device=cuda)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.relu(static_in @ weight) @ weight.T
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info(device)[0]
    reserved_before = allocator.read(device).reserved_bytes
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.relu(static_in @ weight) @ weight.T
    torch.cuda.synchronize()
    pool_bytes = free_before - torch.cuda.mem_get_info(device)[0]
    reserved_delta = allocator.read(device).reserved_bytes - reserved_before
    assert pool_bytes > 0 and reserved_delta > 0
    fresh = torch.randn(256, 4096, device=cuda)
    static_in.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    expected = torch.relu(fresh @ weight) @ weight.T
    assert torch.allclose(static_out, expected, rtol=1e-3, atol=1e-2)
    replay_us = gpu_time_us(graph.replay, 50)
    gpu_report["cuda_graph"] = {
        "pool_bytes_free_delta": pool_bytes,
        "reserved_delta": reserved_delta,
        "replay_us": replay_us,
    }
    del graph, static_out
    torch.cuda.empty_cache()
