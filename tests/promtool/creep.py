"""Memory creep: time to OOM, allocator cache growth and CUDA graph pool growth.

Expected labels and descriptions are spelled out by hand, so they check the rules instead of
echoing them.
"""

from __future__ import annotations

from exporter.catalog import (
    ACTION_LABEL,
    CUDAGRAPH_POOL_BYTES,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    TORCH_ALLOCATED,
    TORCH_DEVICE_TOTAL,
    TORCH_RESERVED,
)
from tests.promtool.model import (
    Expected,
    Scenario,
    fires,
    healthy,
    pending,
    resolved,
    series_text,
    values_text,
)
from tests.promtool.series import (
    DEVICE_TOTAL,
    GIB,
    INSTANCE,
    TARGET,
    engine_up,
    labels,
    memory_bytes,
    s,
    wobble,
)


def gpu_memory(used: str, minutes: int) -> dict[str, str]:
    return {
        s(GPU_MEMORY_USED, gpu="0"): used,
        s(GPU_MEMORY_TOTAL, gpu="0"): f"{DEVICE_TOTAL}x{minutes - 1}",
    }


def torch_memory(reserved: str, minutes: int) -> dict[str, str]:
    return {
        s(TORCH_RESERVED, device="cuda:0"): reserved,
        s(TORCH_DEVICE_TOTAL, device="cuda:0"): f"{DEVICE_TOTAL}x{minutes - 1}",
    }


def time_to_oom(severity: str, source: str) -> dict[str, str]:
    return labels(severity, source=source)


def oom_desc_at(source: str, percent: str, horizon: str) -> str:
    return (
        f"{source} memory on {INSTANCE} has grown steadily and is projected at {percent} of "
        f"capacity within {horizon}."
    )


# Device memory settles at 62% after start-up and grows 3 points an hour until 12h30m (13h).
DEVICE_CREEP = gpu_memory(memory_bytes(810, 0.62, 0.03, growth_stops=750), 810)
# Settles at 92% and stays there, wobbling, for 12 hours.
DEVICE_HIGH_FLAT = gpu_memory(memory_bytes(730, 0.92), 730)
# High and flat, with an engine restart at 6h: memory drops and ramps up again.
DEVICE_RESTART = gpu_memory(memory_bytes(540, 0.9, restart_at=360), 540)
# PyTorch's reserved memory creeps 4 points an hour from 55%.
TORCH_CREEP = torch_memory(memory_bytes(480, 0.55, 0.04), 480)

DEVICE_WARNING = time_to_oom("warning", "device")
DEVICE_CRITICAL = time_to_oom("critical", "device")
TORCH_WARNING = time_to_oom("warning", "torch_reserved")

CREEP_SCENARIOS = (
    Scenario(
        "WardenTimeToOOM",
        "device memory creeping 3 points an hour from 62% for 12 hours",
        DEVICE_CREEP,
        (
            healthy("30m"),
            healthy("3h"),
            healthy("6h30m"),
            pending("7h10m", DEVICE_WARNING),
            # 0.62 + 0.03 * (7h55m + 6h) = 1.0375
            fires("8h", Expected(DEVICE_WARNING, oom_desc_at("device", "103.8%", "6h"))),
            pending(
                "11h50m",
                DEVICE_CRITICAL,
                also_firing=[Expected(DEVICE_WARNING, oom_desc_at("device", "115.3%", "6h"))],
            ),
            fires(
                "12h15m",
                # 0.62 + 0.03 * (12h10m + 1h) = 1.015; + 6h: 1.165
                Expected(DEVICE_CRITICAL, oom_desc_at("device", "101.5%", "1h")),
                Expected(DEVICE_WARNING, oom_desc_at("device", "116.5%", "6h")),
            ),
            resolved("13h"),
        ),
    ),
    Scenario(
        "WardenTimeToOOM",
        "device memory high (92%) but flat for 12 hours",
        DEVICE_HIGH_FLAT,
        (healthy("20m"), healthy("1h"), healthy("2h"), healthy("6h"), healthy("12h")),
    ),
    Scenario(
        "WardenTimeToOOM",
        "an engine restart: memory freed and allocated again",
        DEVICE_RESTART,
        (healthy("6h5m"), healthy("6h15m"), healthy("6h40m"), healthy("7h30m"), healthy("8h")),
    ),
    Scenario(
        "WardenTimeToOOM",
        "PyTorch reserved memory creeping 4 points an hour",
        TORCH_CREEP,
        (
            healthy("4h"),
            fires("6h30m", Expected(TORCH_WARNING, oom_desc_at("torch_reserved", "104.6%", "6h"))),
        ),
    ),
)


def allocator(
    minutes: int, gap_gib: float, gib_per_hour: float, growth_stops: int
) -> dict[str, str]:
    """PyTorch allocator series whose cached gap (reserved - allocated) reaches ``gap_gib`` in
    3 minutes, then grows ``gib_per_hour`` until ``growth_stops``; live tensors churn."""
    allocated, reserved = [], []
    for minute in range(minutes):
        live = 50 * GIB + wobble(minute, 2 * GIB, period=5)
        grown = max(0, min(minute, growth_stops) - 3) / 60 * gib_per_hour
        gap = min(minute, 3) / 3 * gap_gib * GIB + grown * GIB + wobble(minute, GIB / 8, 11)
        allocated.append(round(live))
        reserved.append(round(live + gap))
    return {
        **engine_up(minutes, down_first=2),
        s(TORCH_ALLOCATED, device="cuda:0"): values_text(allocated),
        s(TORCH_RESERVED, device="cuda:0"): values_text(reserved),
        s(TORCH_DEVICE_TOTAL, device="cuda:0"): f"{DEVICE_TOTAL}x{minutes - 1}",
    }


# Gap of 2 GiB growing 1 GiB an hour for 6 hours, then steady.
CACHE_LEAK = allocator(540, 2, 1, growth_stops=360)
# Gap of 10 GiB (12.5% of the device), not growing.
CACHE_HIGH_FLAT = allocator(420, 10, 0, growth_stops=0)

CACHE_GROWTH = labels("warning")


def cache_desc(per_hour: str) -> str:
    return (
        f"Memory PyTorch reserved but does not use on {INSTANCE} grows by {per_hour}B per hour "
        "(fragmentation or a leak in the cache)."
    )


CACHE_SCENARIOS = (
    Scenario(
        "WardenAllocatorCacheGrowth",
        "cached gap growing 1 GiB an hour for 6 hours",
        CACHE_LEAK,
        (
            healthy("1h"),
            pending("2h30m", CACHE_GROWTH),
            # about 1 GiB an hour, less a little wobble
            fires("4h", Expected(CACHE_GROWTH, cache_desc("1017Mi"))),
            fires("6h", Expected(CACHE_GROWTH, cache_desc("1015Mi"))),
            resolved("8h30m"),
        ),
    ),
    Scenario(
        "WardenAllocatorCacheGrowth",
        "cached gap at 12.5% of the device but flat",
        CACHE_HIGH_FLAT,
        (healthy("10m"), healthy("30m"), healthy("1h"), healthy("3h"), healthy("6h50m")),
    ),
)


def graph_pool(minutes: int, pool_gib: float, restart_at: int | None = None) -> dict[str, str]:
    """The graph pool vLLM captures at start-up (minute 2, again after a restart), fixed after:
    ``pool_gib`` 0 is an eager engine."""
    pool = []
    for minute in range(minutes):
        since_start = minute - restart_at if restart_at and minute >= restart_at else minute
        pool.append(round(pool_gib * GIB) if since_start >= 2 else 0)
    return {series_text(CUDAGRAPH_POOL_BYTES, TARGET): values_text(pool)}


def with_graphs(series: dict[str, str], minutes: int, pool_gib: float) -> dict[str, str]:
    return {**series, **graph_pool(minutes, pool_gib)}


# The cache leak above, with 2 GiB of CUDA graphs (and the same leak on an eager engine).
GRAPHS_CACHE_LEAK = with_graphs(CACHE_LEAK, 540, 2)
EAGER_CACHE_LEAK = with_graphs(CACHE_LEAK, 540, 0)
# PyTorch reserved memory creeping 4 points an hour, with CUDA graphs.
GRAPHS_TORCH_CREEP = with_graphs({**TORCH_CREEP, **engine_up(480, down_first=2)}, 480, 2)
# CUDA graphs and a large but flat cached gap.
GRAPHS_CACHE_FLAT = with_graphs(CACHE_HIGH_FLAT, 420, 2)
# Start-up captures twice (a restart at 2h), memory steady: graphs alone never trigger.
GRAPHS_RESTART = {
    **engine_up(300, down=(120, 122)),
    **graph_pool(300, 2, restart_at=120),
    **torch_memory(memory_bytes(300, 0.7, restart_at=120), 300),
}
EAGER_FALLBACK = labels("warning", **{ACTION_LABEL: "enforce_eager"})
EAGER_DESC = (
    f"{INSTANCE} runs CUDA graphs (2GiB of graph pool) and PyTorch's reserved memory keeps "
    "outgrowing what it uses (allocator cache growth, or reserved memory projected full within "
    "6h); the supervisor restarts vLLM with --enforce-eager."
)

GRAPH_SCENARIOS = (
    Scenario(
        "WardenMemoryCreepWithCudaGraphs",
        "allocator cache growing 1 GiB an hour on an engine with CUDA graphs",
        GRAPHS_CACHE_LEAK,
        (
            healthy("1h50m"),
            pending("2h20m", EAGER_FALLBACK),
            fires("3h", Expected(EAGER_FALLBACK, EAGER_DESC)),
            fires("6h", Expected(EAGER_FALLBACK, EAGER_DESC)),
            resolved("8h30m"),
        ),
    ),
    Scenario(
        "WardenMemoryCreepWithCudaGraphs",
        "the same cache growth on an eager engine (no graph pool)",
        EAGER_CACHE_LEAK,
        (healthy("2h20m"), healthy("3h"), healthy("6h"), healthy("8h30m")),
    ),
    Scenario(
        "WardenMemoryCreepWithCudaGraphs",
        "PyTorch reserved memory creeping 4 points an hour with CUDA graphs",
        GRAPHS_TORCH_CREEP,
        (healthy("4h"), fires("6h30m", Expected(EAGER_FALLBACK, EAGER_DESC))),
    ),
    Scenario(
        "WardenMemoryCreepWithCudaGraphs",
        "CUDA graphs and a cached gap at 12.5% of the device, flat",
        GRAPHS_CACHE_FLAT,
        (healthy("1h"), healthy("3h"), healthy("6h50m")),
    ),
    Scenario(
        "WardenMemoryCreepWithCudaGraphs",
        "start-up captures, an engine restart, memory steady",
        GRAPHS_RESTART,
        (healthy("10m"), healthy("2h5m"), healthy("2h20m"), healthy("3h10m"), healthy("4h50m")),
    ),
)
