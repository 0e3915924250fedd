"""vLLM on a CPU host: a KV cache size that lets it start, chosen before it is started.

vLLM's CPU backend reserves ``--gpu-memory-utilization`` (0.92 by default) of the node's
memory for itself unless ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache) is set, and refuses to
start when that much is not free, which on a machine running anything else is always. When
the operator chose none of the three sizes, ``warden serve`` sets ``VLLM_CPU_KVCACHE_SPACE``
to a quarter of the memory available now and says so; with too little memory free to start at
all it fails at once with the fix.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

GIB = 1 << 30
KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
# vLLM flags that size its memory: an operator who gave one has chosen.
SIZE_FLAGS = ("--kv-cache-memory-bytes", "--kv-cache-memory", "--gpu-memory-utilization")
AVAILABLE_SHARE = 4  # the KV cache gets a quarter of the memory available at start
MIN_AVAILABLE_GIB = 2.0  # below this the model and a 1 GiB cache cannot both fit


class CpuMemoryError(RuntimeError):
    """Too little memory is free for vLLM on CPU to start; the message says what to do."""


def is_cpu_build(env: Mapping[str, str]) -> bool:
    """vLLM's own test (``vllm.platforms.cpu_platform_plugin``) without importing vLLM:
    ``VLLM_TARGET_DEVICE=cpu``, or an installed vLLM whose version names cpu (``vllm-cpu``)."""
    if env.get("VLLM_TARGET_DEVICE", "").lower() == "cpu":
        return True
    for distribution, suffix in (("vllm", ""), ("vllm-cpu", "+cpu")):
        try:
            return "cpu" in importlib.metadata.version(distribution) + suffix
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def sized_by_operator(env: Mapping[str, str], vllm_args: Sequence[str]) -> bool:
    if env.get(KV_ENV, "").strip():
        return True
    return any(
        arg == flag or arg.startswith(flag + "=") for arg in vllm_args for flag in SIZE_FLAGS
    )


@dataclass(frozen=True)
class KvCacheDefault:
    gib: int
    reason: str


def kv_cache_default(
    env: Mapping[str, str], vllm_args: Sequence[str], available_bytes: int, total_bytes: int
) -> KvCacheDefault | None:
    """The ``VLLM_CPU_KVCACHE_SPACE`` to set, or None when there is nothing to choose (not a
    CPU build, or the operator sized it). Raises CpuMemoryError when vLLM cannot start."""
    if not is_cpu_build(env) or sized_by_operator(env, vllm_args):
        return None
    available_gib = available_bytes / GIB
    if available_gib < MIN_AVAILABLE_GIB:
        raise CpuMemoryError(
            f"only {available_gib:.1f} GiB of memory is available: vLLM on CPU needs the model "
            f"and its KV cache in memory. Free memory, or set {KV_ENV} (GiB of KV cache) to "
            "what fits"
        )
    gib = max(1, int(available_gib // AVAILABLE_SHARE))
    reason = (
        f"{KV_ENV} is not set: vLLM on CPU would reserve 0.92 of this node's memory "
        f"({0.92 * total_bytes / GIB:.1f} GiB) and refuse to start when that much is not free. "
        f"Using {KV_ENV}={gib} (GiB of KV cache, a quarter of the {available_gib:.1f} GiB "
        f"available now); set {KV_ENV} yourself to choose"
    )
    return KvCacheDefault(gib, reason)


def _read_int(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().split()[0])
    return None


def memory_now(sys_root: Path = Path("/sys")) -> tuple[int, int]:
    """(available, total) bytes as vLLM's CPU worker will judge them, read without vLLM
    (importing it takes seconds): the smallest of the machine's, memory node 0's (vLLM places
    its cache on the first allowed node) and the cgroup's (containers)."""
    vm = psutil.virtual_memory()
    available, total = int(vm.available), int(vm.total)
    meminfo: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in (sys_root / "devices/system/node/node0/meminfo").read_text().splitlines():
            parts = line.split()  # "Node 0 MemFree:  97421888 kB"
            meminfo[parts[2].rstrip(":")] = int(parts[3]) * 1024
    if "MemTotal" in meminfo:
        total = min(total, meminfo["MemTotal"])
        node_available = sum(
            meminfo.get(key, 0)
            for key in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")
        )
        available = min(available, node_available)
    limit = _read_int(sys_root / "fs/cgroup/memory.max")
    if limit is not None and limit < total:
        usage = _read_int(sys_root / "fs/cgroup/memory.current") or 0
        total, available = limit, max(0, min(available, limit - usage))
    return available, total
