"""Memory creep: time to OOM (the risk beyond the engine's plan), allocator cache growth and
CUDA graph pool growth.

Expected labels and descriptions are spelled out by hand, so they check the rules instead of
echoing them.
"""

from __future__ import annotations

from exporter.catalog import (
    ACTION_LABEL,
    CUDAGRAPH_POOL_BYTES,
    MEMORY_RISK,
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


def risk(source: str, values: list[float]) -> dict[str, str]:
    """warden_memory_risk_ratio of one source, one sample a minute."""
    return {s(MEMORY_RISK, source=source): values_text(round(v, 4) for v in values)}


def torch_memory(reserved: str, minutes: int) -> dict[str, str]:
    return {
        s(TORCH_RESERVED, device="cuda:0"): reserved,
        s(TORCH_DEVICE_TOTAL, device="cuda:0"): f"{DEVICE_TOTAL}x{minutes - 1}",
    }


def time_to_oom(severity: str, source: str) -> dict[str, str]:
    return labels(severity, source=source)


def oom_desc_at(source: str, percent: str, horizon: str) -> str:
    return (
        f"{source} memory on {INSTANCE} keeps growing beyond the engine's plan; at this rate it "
        f"reaches {percent} of the headroom within {horizon} (100% = the device is full)."
    )


# The field report on an H200 (140.54 GiB): PyTorch reserved grows 99 -> 134.7 GiB in the first
# hour and to 140.9 GiB by hour six while allocated stays near 99 GiB. The engine planned 0.72 of
# the device (101.19 GiB), so the headroom is 39.35 GiB and the allocator risk is
# (reserved - 101.19) / 39.35: 0 for the first 4 minutes, 0.85 at 1h, 1 (clamped) from 5h40m.
# NVML sees the same growth (reserved memory is device memory in use), 1 GiB lower: the device
# risk follows the same curve a little later.
H200 = 140.54
PLANNED = 0.72 * H200


def field_reserved_gib(minute: int) -> float:
    if minute <= 60:
        return 99 + (134.7 - 99) * minute / 60
    return 134.7 + (140.9 - 134.7) * (minute - 60) / 300


def field_risk(minute: int, offset_gib: float = 0.0) -> float:
    reserved = field_reserved_gib(minute) - offset_gib
    jitter = wobble(minute, 0.002, period=7)
    return min(1.0, max(0.0, (reserved - PLANNED) / (H200 - PLANNED) + jitter))


# The operator restarts the engine at 6h: a new plan, risk 0 again.
FIELD_CREEP = {
    **risk("allocator", [field_risk(m) if m < 360 else 0.0 for m in range(420)]),
    **risk("device", [field_risk(m, offset_gib=1.0) if m < 360 else 0.0 for m in range(420)]),
}
# Memory within the plan at full load for 12 hours: both risks 0.
WITHIN_PLAN = {
    **risk("allocator", [0.0] * 720),
    **risk("device", [0.0] * 720),
}
# A neighbour took 30% of the headroom once, at 10m, and kept it: high but flat for 12 hours.
NEIGHBOUR_FLAT = risk("device", [0.0] * 10 + [0.3 + wobble(m, 0.003) for m in range(10, 720)])
# The risk grows 0.2 an hour for 2 hours (a cache warming up beyond the plan), then stays.
GROWTH_STOPS = risk("allocator", [min(m, 120) / 60 * 0.2 + wobble(m, 0.002) for m in range(540)])

ALLOCATOR_WARNING = time_to_oom("warning", "allocator")
ALLOCATOR_CRITICAL = time_to_oom("critical", "allocator")
DEVICE_WARNING = time_to_oom("warning", "device")
DEVICE_CRITICAL = time_to_oom("critical", "device")

CREEP_SCENARIOS = (
    Scenario(
        "WardenTimeToOOM",
        "the H200 field creep: reserved 99 -> 134.7 GiB in an hour, 140.9 GiB by hour six",
        FIELD_CREEP,
        (
            healthy("50m"),
            # at the first hour's rate the last minute would fill the headroom in about ten
            # minutes: the fast rule is pending, and clears as the creep slows after the hour
            pending("1h", time_to_oom("critical", "allocator") | {"horizon": "10m"}),
            healthy("1h2m"),
            # the 2-hour window has used some of the margin all along from 2h04m
            pending("2h10m", ALLOCATOR_WARNING, DEVICE_WARNING),
            # the 1-hour horizon is reached inside the critical for
            pending(
                "4h55m",
                ALLOCATOR_CRITICAL,
                also_firing=[
                    Expected(ALLOCATOR_WARNING, oom_desc_at("allocator", "116.4%", "6h")),
                    Expected(DEVICE_WARNING, oom_desc_at("device", "113.9%", "6h")),
                ],
            ),
            fires(
                "2h40m",
                # the 2-hour trend still holds the first hour's steep climb
                Expected(ALLOCATOR_WARNING, oom_desc_at("allocator", "153.5%", "6h")),
                Expected(DEVICE_WARNING, oom_desc_at("device", "151%", "6h")),
            ),
            fires(
                "5h",
                # risk 0.852 + 0.0315 an hour since 1h: 0.978 at 5h, 1.009 at 6h, 1.167 at 11h
                Expected(ALLOCATOR_CRITICAL, oom_desc_at("allocator", "100.9%", "1h")),
                Expected(ALLOCATOR_WARNING, oom_desc_at("allocator", "116.6%", "6h")),
                Expected(DEVICE_WARNING, oom_desc_at("device", "114.1%", "6h")),
            ),
            resolved("6h5m"),
            resolved("6h59m"),
        ),
    ),
    Scenario(
        "WardenTimeToOOM",
        "an engine within its plan at full load for 12 hours",
        WITHIN_PLAN,
        (healthy("20m"), healthy("1h"), healthy("2h"), healthy("6h"), healthy("11h59m")),
    ),
    Scenario(
        "WardenTimeToOOM",
        "a neighbour took 30% of the headroom once and kept it",
        NEIGHBOUR_FLAT,
        (healthy("20m"), healthy("1h"), healthy("3h"), healthy("6h"), healthy("11h59m")),
    ),
    Scenario(
        "WardenTimeToOOM",
        "growth beyond the plan that stops at 40% of the headroom",
        GROWTH_STOPS,
        (healthy("1h"), healthy("2h"), healthy("3h"), healthy("6h"), healthy("8h59m")),
    ),
)


def risk_every_5s(source: str, values: list[float]) -> dict[str, str]:
    """warden_memory_risk_ratio of one source, one sample every 5 seconds."""
    return {s(MEMORY_RISK, source=source): values_text(round(v, 4) for v in values)}


# Host memory of the engine's processes grows under load (vLLM #50150): from 3 minutes in, the
# risk climbs 1/300 a second, so the headroom would be gone 5 minutes later (at 8m); the
# supervisor restarts the engine at 6m (risk 0.6, its early restart risk): a new plan, risk 0.
FAST_HOST_CREEP = risk_every_5s(
    "host", [max(0.0, (5 * i - 180) / 300) if 5 * i < 360 else 0.0 for i in range(12 * 10)]
)
# One big allocation at 3m that stays: the risk steps to 0.3 and stays there, with churn.
HOST_STEP = risk_every_5s(
    "host", [0.0] * 36 + [0.3 + wobble(i, 0.005) for i in range(12 * 10 - 36)]
)
FAST_CRITICAL = time_to_oom("critical", "host") | {"horizon": "10m"}


def fast_desc(left: str) -> str:
    return (
        f"host memory on {INSTANCE} grows fast beyond the engine's plan; at the rate of the last "
        f"minute the headroom is gone in {left} (the supervisor drains and restarts the engine "
        "before that)."
    )


FAST_CREEP_SCENARIOS = (
    Scenario(
        "WardenTimeToOOM",
        "host memory creeping to its limit within 5 minutes",
        FAST_HOST_CREEP,
        (
            healthy("3m"),
            # some of the margin used for 30 s (risk 0.05 at 3m15s): pending
            pending("3m50s", FAST_CRITICAL),
            # risk 0.4 at 5m, growing 0.2 a minute: 3 minutes left
            fires("5m", Expected(FAST_CRITICAL, fast_desc("3m 0s"))),
            resolved("7m"),
        ),
        interval="5s",
    ),
    Scenario(
        "WardenTimeToOOM",
        "one big allocation that stays",
        HOST_STEP,
        (healthy("3m"), healthy("4m30s"), healthy("6m"), healthy("9m")),
        interval="5s",
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
# PyTorch's reserved memory creeps 4 points an hour from 55%.
TORCH_CREEP = torch_memory(memory_bytes(480, 0.55, 0.04), 480)
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
