"""The promtool scenarios: realistic input series for every alert, and what must happen.

Series are built from the catalog's MetricSpecs; expected labels and descriptions are spelled
out by hand, so they check the rules instead of echoing them. Creep alerts run on hours of
one-minute samples with a small wobble, the way memory really moves.
"""

from __future__ import annotations

from collections.abc import Callable

from alerts import recording as rec
from alerts.config import ENGINE_JOB
from alerts.promtool_tests import (
    Check,
    Expected,
    ExprCheck,
    RecordingScenario,
    Sample,
    Scenario,
    TestFile,
    fires,
    healthy,
    pending,
    resolved,
    series_text,
    values_text,
)
from exporter.catalog import (
    ACTION_LABEL,
    COLLECTOR_ERRORS,
    CUDAGRAPH_POOL_BYTES,
    ENGINE_HEALTHY,
    ENGINE_RESTARTS,
    ENGINE_STALLED,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    MEMORY_WATERMARK,
    MEMORY_WATERMARK_PEAK,
    NONFINITE_LOGITS,
    PARAM_ADMIT_FRACTION,
    PARAM_CIRCUIT,
    PARAM_MAX_TOKENS,
    PARAM_PREEMPT,
    PARAM_PRIORITY_THRESHOLD,
    PARAM_RETRY_AFTER,
    REQUEST_RETRIES,
    REQUEST_RETRIES_EXHAUSTED,
    REQUESTS,
    TORCH_ALLOCATED,
    TORCH_DEVICE_TOTAL,
    TORCH_RESERVED,
    VLLM_NUM_PREEMPTIONS,
    VLLM_NUM_REQUESTS_WAITING,
    MetricSpec,
)

INSTANCE = "engine:8000"
TARGET = {"instance": INSTANCE, "job": ENGINE_JOB}
GIB = 2**30
DEVICE_TOTAL = 80 * GIB


def s(metric: MetricSpec | str, **labels: str) -> str:
    """A series of the engine target (vLLM series also get model_name and engine)."""
    base = dict(TARGET)
    if isinstance(metric, MetricSpec) and metric.owner == "vllm":
        base.update(model_name="tiny", engine="0")
    base.update(labels)
    return series_text(metric, base)


def hold(value: float, count: int) -> list[float]:
    return [value] * count


def counter(per_minute: Callable[[int], float], minutes: int, start: float = 0) -> list[float]:
    """Cumulative counter samples, one a minute, adding ``per_minute(t)`` at minute t."""
    total, out = start, []
    for minute in range(minutes):
        if minute:
            total += per_minute(minute)
        out.append(total)
    return out


def wobble(minute: int, amplitude: float, period: int = 7) -> float:
    """Triangle wave in [-amplitude, amplitude]: batch churn on top of a trend."""
    phase = (minute % period) / period
    return amplitude * (4 * abs(phase - 0.5) - 1)


def memory_bytes(
    minutes: int,
    level: float,
    per_hour: float = 0.0,
    *,
    growth_stops: int | None = None,
    restart_at: int | None = None,
    ramp: int = 5,
    jitter: float = 0.002,
) -> str:
    """Used bytes of an 80 GiB device: start-up ramp to ``level``, then a linear trend (in
    fraction of the device per hour) until ``growth_stops``, with wobble. ``restart_at`` starts
    the engine over (memory freed, then the start-up ramp again)."""
    values = []
    for minute in range(minutes):
        since_start = minute - restart_at if restart_at and minute >= restart_at else minute
        if since_start < ramp:
            ratio = 0.01 + (level - 0.01) * since_start / ramp
        else:
            grown = min(minute, growth_stops if growth_stops is not None else minute) - ramp
            ratio = level + per_hour * grown / 60 + wobble(minute, jitter)
        values.append(round(ratio * DEVICE_TOTAL))
    return values_text(values)


def engine_up(
    minutes: int, down_first: int = 0, down: tuple[int, int] | None = None
) -> dict[str, str]:
    """``up`` of the engine target: failing scrapes for the first ``down_first`` minutes (the
    engine is loading) and during ``down`` (start and end minute, a restart)."""
    values = [
        0 if minute < down_first or (down and down[0] <= minute < down[1]) else 1
        for minute in range(minutes)
    ]
    return {series_text("up", TARGET): values_text(values)}


def labels(severity: str, **extra: str) -> dict[str, str]:
    return {"instance": INSTANCE, "severity": severity, **extra}


# --- Memory watermark ------------------------------------------------------------------------
WATERMARK_HIGH = labels("warning", **{ACTION_LABEL: "stop_admission", PARAM_RETRY_AFTER: "10"})
WATERMARK_CRITICAL = labels(
    "critical",
    **{ACTION_LABEL: "shed_low_priority", PARAM_PRIORITY_THRESHOLD: "0", PARAM_PREEMPT: "1"},
)
OOM_IMMINENT = labels("critical", **{ACTION_LABEL: "reject_all", PARAM_RETRY_AFTER: "30"})
_LEVELS = "(1 high, 2 critical, 3 oom_imminent)"


def high_desc(level: int) -> str:
    return (
        f"Memory watermark on {INSTANCE} reached level {level} {_LEVELS} within the last minute; "
        "new requests get 503 with Retry-After until it drops."
    )


def critical_desc(level: int) -> str:
    return (
        f"Memory watermark on {INSTANCE} reached level {level} {_LEVELS} within the last minute; "
        "warden refuses low-priority requests and preempts the largest running one."
    )


def oom_desc(level: int) -> str:
    return (
        f"Memory watermark on {INSTANCE} reached level {level} {_LEVELS} within the last minute; "
        "warden rejects every new request with Retry-After to avoid an out-of-memory crash."
    )


MEMORY_ALERTS = (
    ("WardenMemoryWatermarkHigh", WATERMARK_HIGH),
    ("WardenMemoryWatermarkCritical", WATERMARK_CRITICAL),
    ("WardenOOMImminent", OOM_IMMINENT),
)


def duration(seconds: int) -> str:
    """Seconds as a promtool duration: 135 -> ``2m15s``."""
    minutes, rest = divmod(seconds, 60)
    text = (f"{minutes}m" if minutes else "") + (f"{rest}s" if rest else "")
    return text or "0s"


def never_fires(until: int, pending_from: int, pending_until: int) -> tuple[Check, ...]:
    """At every 15s evaluation up to ``until`` seconds, no memory alert fires: each is pending
    from ``pending_from`` to ``pending_until`` (the peak holds the condition), quiet otherwise."""
    return tuple(
        pending(duration(at), labels, alertname=name)
        if pending_from <= at <= pending_until
        else healthy(duration(at), alertname=name)
        for at in range(0, until + 1, 15)
        for name, labels in MEMORY_ALERTS
    )


# The input is the exporter's peak gauge, warden_memory_watermark_peak, scraped every 15s: the
# highest level of its last 15s, so a spike the reflex absorbs within a second shows in one or
# two scrapes. The alerts read its max over the last minute (range selectors include both ends in
# the promtool here), so a level the gauge shows at T keeps their condition true from T to T + 1m.
PEAK = s(MEMORY_WATERMARK_PEAK)
LEVEL = s(MEMORY_WATERMARK)

# 15s samples: 0 until 45s, 1 from 1m, 2 from 3m, 3 from 5m, back to 0 from 8m. The record is
# >= 1 from 1m, >= 2 from 3m, 3 from 5m, and drops to 0 at 9m.
CLIMB_TO_OOM = {PEAK: "0x3 1x7 2x7 3x11 0x8"}
# 15s samples: level 1 from 2m to 5m45s; the record is 1 from 2m to 6m45s.
HIGH_FOR_4M = {PEAK: "0x7 1x15 0x15"}
# 15s samples: 1 at 2m, 2 at 2m15s and 2m30s, 3 at 2m45s, then 0: the reflex brought it back in
# 45s. Record >= 1 from 2m, >= 2 from 2m15s, 3 from 2m45s, all until 3m45s: 105s, 90s and 60s.
BLIP = {PEAK: "0x7 1 2x1 3 0x20"}
# 15s samples: 3 at 2m and 2m15s, else 0: one spike the reflex handled within a second, held by
# the gauge for its 15s window and so seen by two scrapes. Record 3 from 2m to 3m15s (75s).
SPIKE = {PEAK: "0x7 3x1 0x20"}
# 15s samples: the reflex fights a persistent overload. The gauge shows 3 at 1m, 2m, 3m, 4m and
# 5m, 0 in between (3, 0, 0, 0 repeated), then 0 from 5m15s: a spike once a minute, the peak gauge
# is 0 three scrapes out of four, the record over the last minute is 3 from 1m to 6m.
OSCILLATING = {PEAK: " ".join(["0x3", *["3 0x2"] * 5, "0x16"])}
# 15s samples: the engine hits oom_imminent every few seconds from 1m to 5m45s and the reflex
# absorbs each spike within a second, so the current level reads 0 at every scrape while the peak
# gauge reads 3 at every one of them. Record 3 from 1m to 6m45s.
BETWEEN_SCRAPES = {LEVEL: "0x40", PEAK: "0x3 3x19 0x17"}
NORMAL = {LEVEL: "0x40", PEAK: "0x40"}

MEMORY_SCENARIOS = (
    Scenario(
        "WardenMemoryWatermarkHigh",
        "level 1 for 4 minutes",
        HIGH_FOR_4M,
        (
            healthy("1m45s"),
            pending("3m45s", WATERMARK_HIGH),
            fires("4m", Expected(WATERMARK_HIGH, high_desc(1))),
            healthy("5m", alertname="WardenMemoryWatermarkCritical"),
            # back at 0 since 6m; level 1 was reached within the last minute
            fires("6m30s", Expected(WATERMARK_HIGH, high_desc(1))),
            resolved("7m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenMemoryWatermarkHigh",
        "a 45s excursion up to level 3 fires nothing",
        BLIP,
        (
            healthy("1m45s"),
            # the last evaluation before the peak drops: every level pending, none fired
            pending("3m45s", WATERMARK_HIGH),
            pending("3m45s", WATERMARK_CRITICAL, alertname="WardenMemoryWatermarkCritical"),
            pending("3m45s", OOM_IMMINENT, alertname="WardenOOMImminent"),
            healthy("4m"),
            healthy("4m", alertname="WardenMemoryWatermarkCritical"),
            healthy("4m", alertname="WardenOOMImminent"),
            healthy("7m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenOOMImminent",
        "a 15s spike to oom_imminent fires nothing",
        SPIKE,
        never_fires(until=300, pending_from=120, pending_until=195),
        interval="15s",
    ),
    Scenario(
        "WardenOOMImminent",
        "level 0 for 10 minutes",
        NORMAL,
        tuple(
            healthy(at, alertname=name) for at in ("1m", "5m", "9m45s") for name, _ in MEMORY_ALERTS
        ),
        interval="15s",
    ),
    Scenario(
        "WardenMemoryWatermarkHigh",
        "climb to oom_imminent and recover",
        CLIMB_TO_OOM,
        (
            pending("2m45s", WATERMARK_HIGH),
            fires("3m", Expected(WATERMARK_HIGH, high_desc(2))),
            fires("6m", Expected(WATERMARK_HIGH, high_desc(3))),
            # back at 0 since 8m
            fires("8m30s", Expected(WATERMARK_HIGH, high_desc(3))),
            resolved("9m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenMemoryWatermarkCritical",
        "climb to oom_imminent and recover",
        CLIMB_TO_OOM,
        (
            healthy("2m45s"),
            pending("4m45s", WATERMARK_CRITICAL),
            fires("5m", Expected(WATERMARK_CRITICAL, critical_desc(3))),
            fires("8m30s", Expected(WATERMARK_CRITICAL, critical_desc(3))),
            resolved("9m"),
            resolved("9m45s"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenOOMImminent",
        "climb to oom_imminent and recover",
        CLIMB_TO_OOM,
        (
            healthy("4m45s"),
            pending("5m15s", OOM_IMMINENT),
            pending("6m15s", OOM_IMMINENT),
            fires("6m30s", Expected(OOM_IMMINENT, oom_desc(3))),
            fires("8m30s", Expected(OOM_IMMINENT, oom_desc(3))),
            resolved("9m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenOOMImminent",
        "the reflex knocks level 3 back to 0 every minute for 5 minutes",
        OSCILLATING,
        (
            healthy("45s"),
            pending("1m", OOM_IMMINENT),
            pending("2m15s", OOM_IMMINENT),
            fires("2m30s", Expected(OOM_IMMINENT, oom_desc(3))),
            # the peak gauge reads 0 here (it last showed a spike at 4m)
            fires("4m45s", Expected(OOM_IMMINENT, oom_desc(3))),
            fires("5m45s", Expected(OOM_IMMINENT, oom_desc(3))),
            resolved("6m15s"),
            resolved("9m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenMemoryWatermarkHigh",
        "the reflex knocks level 3 back to 0 every minute for 5 minutes",
        OSCILLATING,
        (
            healthy("45s"),
            pending("2m45s", WATERMARK_HIGH),
            fires("3m", Expected(WATERMARK_HIGH, high_desc(3))),
            fires("4m45s", Expected(WATERMARK_HIGH, high_desc(3))),
            resolved("6m15s"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenOOMImminent",
        "level 3 every few seconds, back to 0 before every scrape",
        BETWEEN_SCRAPES,
        (
            healthy("45s"),
            pending("1m", OOM_IMMINENT),
            pending("2m15s", OOM_IMMINENT),
            fires("2m30s", Expected(OOM_IMMINENT, oom_desc(3))),
            fires("6m45s", Expected(OOM_IMMINENT, oom_desc(3))),
            resolved("7m"),
        ),
        interval="15s",
    ),
    Scenario(
        "WardenMemoryWatermarkCritical",
        "the reflex knocks level 3 back to 0 every minute for 5 minutes",
        OSCILLATING,
        (
            healthy("45s"),
            pending("2m45s", WATERMARK_CRITICAL),
            fires("3m", Expected(WATERMARK_CRITICAL, critical_desc(3))),
            fires("5m45s", Expected(WATERMARK_CRITICAL, critical_desc(3))),
            resolved("6m15s"),
        ),
        interval="15s",
    ),
)


# --- Memory creep ----------------------------------------------------------------------------
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


# --- Traffic ---------------------------------------------------------------------------------
BACKLOG_2048 = labels("warning", **{ACTION_LABEL: "cap_max_tokens", PARAM_MAX_TOKENS: "2048"})
BACKLOG_512 = labels("warning", **{ACTION_LABEL: "cap_max_tokens", PARAM_MAX_TOKENS: "512"})
BACKLOG_SHED = labels(
    "critical", **{ACTION_LABEL: "shed_low_priority", PARAM_PRIORITY_THRESHOLD: "0"}
)
BACKLOG_REJECT = labels("critical", **{ACTION_LABEL: "reject_all", PARAM_RETRY_AFTER: "30"})


def backlog_desc(waiting: int, effect: str) -> str:
    return f"{waiting} requests are waiting on {INSTANCE}; {effect}."


def cap_2048(waiting: int) -> Expected:
    return Expected(BACKLOG_2048, backlog_desc(waiting, "warden caps max_tokens at 2048"))


def cap_512(waiting: int) -> Expected:
    return Expected(BACKLOG_512, backlog_desc(waiting, "warden caps max_tokens at 512"))


def shed(waiting: int) -> Expected:
    return Expected(BACKLOG_SHED, backlog_desc(waiting, "warden refuses low-priority requests"))


def reject(waiting: int) -> Expected:
    return Expected(BACKLOG_REJECT, backlog_desc(waiting, "warden rejects all new requests"))


def queue(*steps: tuple[int, int]) -> list[float]:
    """Queue length per minute from (length, minutes) steps."""
    return [float(length) for length, minutes in steps for _ in range(minutes)]


# Two engines (data parallel) share the instance's queue: the instance total counts.
_QUEUE_RAMP = queue((10, 5), (150, 10), (300, 10), (450, 10), (600, 10), (0, 15))
QUEUE_CLIMB = {
    s(VLLM_NUM_REQUESTS_WAITING, engine="0"): values_text(_QUEUE_RAMP),
    s(VLLM_NUM_REQUESTS_WAITING, engine="1"): values_text(
        queue((10, 5), (150, 10), (300, 10), (450, 10), (600, 10), (0, 15))
    ),
}
# Short bursts over 100 (one minute each) between long calm stretches.
QUEUE_BURSTS = {
    s(VLLM_NUM_REQUESTS_WAITING): values_text(
        queue((40, 5), (180, 1), (60, 5), (120, 1), (95, 10), (700, 1), (30, 10))
    )
}

BACKLOG_SCENARIOS = (
    Scenario(
        "WardenQueueBacklog",
        "queue climbs through every band (two engines) and drains",
        QUEUE_CLIMB,
        (
            healthy("4m"),
            pending("6m", BACKLOG_2048),
            fires("8m", cap_2048(300)),
            # 600: the 2048 cap holds on for 2 minutes while the 512 cap waits out its for.
            pending("15m", BACKLOG_512, also_firing=[cap_2048(300)]),
            fires("16m", cap_2048(300), cap_512(600)),
            fires("18m", cap_512(600)),
            pending("25m", BACKLOG_SHED, also_firing=[cap_512(600)]),
            fires("26m", cap_512(600), shed(900)),
            fires("28m", shed(900)),
            pending("35m", BACKLOG_REJECT, also_firing=[shed(900)]),
            fires("36m", shed(900), reject(1200)),
            fires("40m", reject(1200)),
            # drained: reject_all holds for 2 more minutes, then everything is over.
            fires("46m", reject(1200)),
            resolved("47m"),
            resolved("59m"),
        ),
    ),
    Scenario(
        "WardenQueueBacklog",
        "one-minute bursts never fire",
        QUEUE_BURSTS,
        (
            healthy("4m"),
            pending("5m", BACKLOG_2048),
            healthy("7m"),
            healthy("14m"),
            pending("22m", BACKLOG_512),
            healthy("23m"),
            healthy("30m"),
        ),
    ),
)


def per_minute(*steps: tuple[float, int]) -> Callable[[int], float]:
    """A counter's increase each minute from (increase, minutes) steps; zero afterwards."""
    schedule = [rate for rate, minutes in steps for _ in range(minutes)]
    return lambda minute: schedule[minute] if minute < len(schedule) else 0.0


PREEMPTION_STORM = labels("warning")
# 60 preemptions a minute (1/s) from minute 10 to 30.
PREEMPTIONS_BURST = {
    s(VLLM_NUM_PREEMPTIONS): values_text(counter(per_minute((0, 10), (60, 20)), 50))
}
# A steady trickle: 6 a minute (0.1/s) for an hour.
PREEMPTIONS_TRICKLE = {s(VLLM_NUM_PREEMPTIONS): values_text(counter(lambda m: 6, 60))}


def preemption_desc(per_second: str) -> str:
    return (
        f"vLLM on {INSTANCE} preempts {per_second} requests per second; their work is "
        "recomputed or swapped, so throughput collapses."
    )


def requests(minutes: int, **outcomes: Callable[[int], float]) -> dict[str, str]:
    """warden_requests_total by outcome, from per-minute increases."""
    return {
        s(REQUESTS, outcome=name): values_text(counter(increase, minutes))
        for name, increase in outcomes.items()
    }


HALF_OPEN = labels(
    "warning",
    **{ACTION_LABEL: "circuit_breaker", PARAM_CIRCUIT: "half_open", PARAM_ADMIT_FRACTION: "0.5"},
)
OPEN = labels("critical", **{ACTION_LABEL: "circuit_breaker", PARAM_CIRCUIT: "open"})


def half_open(percent: str) -> Expected:
    return Expected(
        HALF_OPEN,
        f"{percent} of requests served on {INSTANCE} ended in a server error; warden admits "
        "only half of new requests.",
    )


def circuit_open(percent: str) -> Expected:
    return Expected(
        OPEN,
        f"{percent} of requests served on {INSTANCE} ended in a server error; warden rejects "
        "new requests until the breaker cools down.",
    )


# 60 successes a minute and 300 rejected (rejections are not served, so not in the ratio);
# server errors: none, then 30/min (1 in 3 served) from 10m, 120/min (2 in 3) from 25m, none
# from 35m.
ERRORS_RISE = requests(
    70,
    success=lambda m: 60,
    rejected=lambda m: 300,
    client_error=lambda m: 6,
    server_error=per_minute((0, 10), (30, 15), (120, 10)),
)
# 2% server errors at a healthy rate, and a near-idle engine where every request fails.
ERRORS_LOW = requests(40, success=lambda m: 98, server_error=lambda m: 2)
ERRORS_IDLE = requests(40, server_error=per_minute(*[(1, 1), (0, 4)] * 8))

TRAFFIC_SCENARIOS = (
    Scenario(
        "WardenPreemptionStorm",
        "one preemption a second for 20 minutes",
        PREEMPTIONS_BURST,
        (
            healthy("10m"),
            pending("14m", PREEMPTION_STORM),
            fires("25m", Expected(PREEMPTION_STORM, preemption_desc("1.00"))),
            resolved("40m"),
        ),
    ),
    Scenario(
        "WardenPreemptionStorm",
        "a steady trickle of preemptions",
        PREEMPTIONS_TRICKLE,
        (healthy("10m"), healthy("30m"), healthy("59m")),
    ),
    Scenario(
        "WardenErrorRateHigh",
        "server errors rise to a third, then two thirds, then stop",
        ERRORS_RISE,
        (
            healthy("9m"),
            pending("13m", HALF_OPEN),
            # 30 errors of 96 served a minute
            fires("20m", half_open("31.25%")),
            pending("27m", OPEN, also_firing=[half_open("56%")]),
            # 120 errors of 186 served a minute
            fires("33m", circuit_open("64.52%"), half_open("64.52%")),
            # errors stopped at 35m: open holds 5 more minutes, half-open 10 (the cool-down)
            # kept alerts show their last value above the threshold
            fires("41m", circuit_open("52.17%"), half_open("26.67%")),
            fires("45m", half_open("26.67%")),
            resolved("50m"),
        ),
    ),
    Scenario(
        "WardenErrorRateHigh",
        "2% errors, and an idle engine whose few requests fail",
        {**ERRORS_LOW, **{k.replace(INSTANCE, "idle:8000"): v for k, v in ERRORS_IDLE.items()}},
        (healthy("10m"), healthy("20m"), healthy("39m")),
    ),
)


# --- Faults ----------------------------------------------------------------------------------
NONFINITE_ANY = labels("warning")
NONFINITE_BAD = labels("critical")


def nonfinite_any(count: int) -> Expected:
    return Expected(
        NONFINITE_ANY,
        f"{count} requests on {INSTANCE} produced NaN or Inf logits in the last 10 minutes.",
    )


def nonfinite_bad(percent: str) -> Expected:
    return Expected(
        NONFINITE_BAD,
        f"{percent} of requests on {INSTANCE} produced NaN or Inf logits over 5 minutes, and it "
        "is widespread or has lasted 30 minutes: suspect corrupted weights or a failing device.",
    )


def nonfinite(minutes: int, nan: Callable[[int], float]) -> dict[str, str]:
    """120 requests a minute; ``nan`` of them have NaN logits; the inf series stays at 0."""
    return {
        **requests(minutes, success=lambda m: 120),
        s(NONFINITE_LOGITS, kind="nan"): values_text(counter(nan, minutes)),
        s(NONFINITE_LOGITS, kind="inf"): values_text(counter(lambda m: 0, minutes)),
    }


# One request with NaN logits at minute 10.
NAN_ONCE = nonfinite(40, per_minute((0, 10), (1, 1)))
# 6 of 120 requests a minute (5%) from minute 10 to 30.
NAN_WIDESPREAD = nonfinite(50, per_minute((0, 10), (6, 20)))
# One request every other minute (0.4%) for an hour: rare but never stopping.
NAN_TRICKLE = nonfinite(70, lambda m: m % 2)

RETRIES_HIGH = labels("warning")
RETRIES_EXHAUSTED = labels("critical")


def retries(
    minutes: int, retried: Callable[[int], float], failed: Callable[[int], float]
) -> dict[str, str]:
    """60 requests a minute; ``retried`` of them retried, ``failed`` still failing after."""
    return {
        **requests(minutes, success=lambda m: 60),
        s(REQUEST_RETRIES, reason="oom"): values_text(counter(retried, minutes)),
        s(REQUEST_RETRIES_EXHAUSTED, reason="oom"): values_text(counter(failed, minutes)),
    }


# 12 retries a minute (20%) from minute 5 to 50, of which 6 a minute (10%) exhausted from 30.
RETRY_STORM = retries(70, per_minute((0, 5), (12, 45)), per_minute((0, 30), (6, 20)))
# 3 retries a minute (5%), none exhausted.
RETRY_NORMAL = retries(60, lambda m: 3, lambda m: 0)


def retries_high(percent: str) -> Expected:
    return Expected(RETRIES_HIGH, f"Retries on {INSTANCE} amount to {percent} of requests served.")


def retries_exhausted(percent: str) -> Expected:
    return Expected(
        RETRIES_EXHAUSTED,
        f"{percent} of requests served on {INSTANCE} still failed after their last retry.",
    )


COLLECTOR_FAILING = labels("warning", collector="nvml")


def collector_desc(per_second: str) -> str:
    return (
        f"Collector nvml on {INSTANCE} raises {per_second} errors per second; the series it "
        "exports are missing, and alerts built on them are blind."
    )


def collector_errors(increase: Callable[[int], float], minutes: int) -> dict[str, str]:
    return {s(COLLECTOR_ERRORS, collector="nvml"): values_text(counter(increase, minutes))}


FAULT_SCENARIOS = (
    Scenario(
        "WardenNonFiniteLogits",
        "one request with NaN logits",
        NAN_ONCE,
        (
            healthy("9m"),
            pending("10m", NONFINITE_ANY),
            fires("12m", nonfinite_any(1)),
            fires("19m", nonfinite_any(1)),
            resolved("21m"),
        ),
    ),
    Scenario(
        "WardenNonFiniteLogits",
        "5% of requests with NaN logits for 20 minutes",
        NAN_WIDESPREAD,
        (
            healthy("9m"),
            pending("13m", NONFINITE_BAD, also_firing=[nonfinite_any(24)]),
            fires("25m", nonfinite_bad("5%"), nonfinite_any(60)),
            # the last NaN was at 29m: the critical clears with the 5m rate, the warning 10m on
            fires("35m", nonfinite_any(24)),
            resolved("39m"),
        ),
    ),
    Scenario(
        "WardenNonFiniteLogits",
        "a rare trickle that never stops",
        NAN_TRICKLE,
        (
            # 0.4% is not widespread; it counts once it has lasted 30 minutes (+5m for)
            fires("20m", nonfinite_any(5)),
            pending("33m", NONFINITE_BAD, also_firing=[nonfinite_any(5)]),
            fires("45m", nonfinite_bad("0.5%"), nonfinite_any(5)),
        ),
    ),
    Scenario(
        "WardenNonFiniteLogits",
        "requests flow, all logits finite",
        nonfinite(40, lambda m: 0),
        (healthy("10m"), healthy("39m")),
    ),
    Scenario(
        "WardenRequestRetriesHigh",
        "a fifth of requests retried, then half of those exhausted",
        RETRY_STORM,
        (
            healthy("5m"),
            pending("10m", RETRIES_HIGH),
            fires("20m", retries_high("20%")),
            pending("33m", RETRIES_EXHAUSTED, also_firing=[retries_high("20%")]),
            fires("45m", retries_exhausted("10%"), retries_high("20%")),
            resolved("60m"),
        ),
    ),
    Scenario(
        "WardenRequestRetriesHigh",
        "5% of requests retried, none exhausted",
        RETRY_NORMAL,
        (healthy("10m"), healthy("30m"), healthy("59m")),
    ),
    Scenario(
        "WardenCollectorErrors",
        "the nvml collector fails every minute from 5m to 30m",
        collector_errors(per_minute((0, 5), (1, 25)), 50),
        (
            healthy("4m"),
            pending("10m", COLLECTOR_FAILING),
            fires("20m", Expected(COLLECTOR_FAILING, collector_desc("0.02"))),
            resolved("40m"),
        ),
    ),
    Scenario(
        "WardenCollectorErrors",
        "a single error, and old errors that stopped",
        collector_errors(per_minute((0, 10), (1, 1)), 40),
        (healthy("9m"), pending("11m", COLLECTOR_FAILING), healthy("16m"), healthy("39m")),
    ),
)


# --- Liveness --------------------------------------------------------------------------------
CRITICAL = labels("critical")


def stalled_desc() -> str:
    return (
        f"The engine on {INSTANCE} has requests running or waiting and completed no step "
        "within the stall timeout (stalled = 1)."
    )


def down_desc(instance: str) -> str:
    return (
        f"Scrapes of engine target {instance} fail (up = 0); an empty instance means job "
        f"{ENGINE_JOB} has no targets at all."
    )


def restarts_desc(count: int) -> str:
    return f"The engine on {INSTANCE} restarted {count} times in the last hour."


def unhealthy_desc() -> str:
    return f"vLLM on {INSTANCE} has failed its health check for 5 minutes (healthy = 0)."


def restarts(every: int, minutes: int, until: int | None = None) -> dict[str, str]:
    """A crash restart every ``every`` minutes (until ``until``)."""
    stop = until if until is not None else minutes

    def crashes(minute: int) -> float:
        return 1.0 if minute % every == 0 and minute < stop else 0.0

    return {s(ENGINE_RESTARTS, reason="crash"): values_text(counter(crashes, minutes))}


OTHER_JOB = {"instance": "localhost:9090", "job": "prometheus"}

LIVENESS_SCENARIOS = (
    Scenario(
        "WardenEngineStalled",
        "stalled for 5 minutes",
        {s(ENGINE_STALLED): "0x4 1x4 0x5"},
        (
            healthy("4m"),
            pending("5m", CRITICAL),
            fires("6m", Expected(CRITICAL, stalled_desc())),
            fires("9m", Expected(CRITICAL, stalled_desc())),
            resolved("10m"),
        ),
    ),
    Scenario(
        "WardenEngineStalled",
        "a one-sample stall",
        {s(ENGINE_STALLED): "0x4 1 0x5"},
        (pending("5m", CRITICAL), healthy("6m"), healthy("10m")),
    ),
    Scenario(
        "WardenEngineDown",
        "scrapes fail for 5 minutes",
        {series_text("up", TARGET): "1x4 0x4 1x5"},
        (
            healthy("4m"),
            pending("6m", CRITICAL),
            fires("7m", Expected(CRITICAL, down_desc(INSTANCE))),
            resolved("10m"),
        ),
    ),
    Scenario(
        "WardenEngineDown",
        "the engine job has no targets",
        {series_text("up", OTHER_JOB): "1x10"},
        (
            pending("1m", {"job": ENGINE_JOB, "severity": "critical"}),
            fires("5m", Expected({"job": ENGINE_JOB, "severity": "critical"}, down_desc(""))),
        ),
    ),
    Scenario(
        "WardenEngineDown",
        "engine up, another job down",
        {series_text("up", TARGET): "1x10", series_text("up", OTHER_JOB): "0x10"},
        (healthy("1m"), healthy("10m")),
    ),
    Scenario(
        "WardenRestartLoop",
        "a crash every 8 minutes for an hour",
        restarts(8, 150, until=60),
        (
            healthy("30m"),
            pending("48m", CRITICAL),
            # crashes at 8, 16, ... 48 minutes
            fires("55m", Expected(CRITICAL, restarts_desc(6))),
            resolved("2h"),
        ),
    ),
    Scenario(
        "WardenRestartLoop",
        "a crash every 15 minutes",
        restarts(15, 180),
        (healthy("1h"), healthy("2h"), healthy("2h59m")),
    ),
    Scenario(
        "WardenEngineUnhealthy",
        "unhealthy for 10 minutes",
        {s(ENGINE_HEALTHY): "1x4 0x9 1x5"},
        (
            healthy("4m"),
            pending("9m", CRITICAL),
            fires("10m", Expected(CRITICAL, unhealthy_desc())),
            resolved("15m"),
        ),
    ),
    Scenario(
        "WardenEngineUnhealthy",
        "unhealthy for 3 minutes during a restart",
        {s(ENGINE_HEALTHY): "1x4 0x2 1x10"},
        (pending("7m", CRITICAL), healthy("8m"), healthy("15m")),
    ),
)


# --- Recording rules -------------------------------------------------------------------------
def at(record: str, value: float, **extra: str) -> Sample:
    """A recorded sample of the engine instance."""
    return Sample(series_text(record, {"instance": INSTANCE, **extra}), value)


RECORDING_SCENARIOS = (
    RecordingScenario(
        "memory watermark: the peak over the last minute",
        # 15s samples of the peak gauge: 0 until 2m, 3 at 2m15s, 1 at 3m30s, else 0; the current
        # level is 0 at every scrape (the reflex absorbed both spikes between scrapes)
        {LEVEL: "0x25", PEAK: "0x8 3 0x3 1 0x10"},
        (
            ExprCheck("2m", rec.WATERMARK_PEAK, (at(rec.WATERMARK_PEAK, 0),)),
            # the peak gauge reads 0; it showed 3 45s ago
            ExprCheck("3m", rec.WATERMARK_PEAK, (at(rec.WATERMARK_PEAK, 3),)),
            # the 3 is over a minute old; the gauge showed 1 30s ago
            ExprCheck("4m", rec.WATERMARK_PEAK, (at(rec.WATERMARK_PEAK, 1),)),
            ExprCheck("5m", rec.WATERMARK_PEAK, (at(rec.WATERMARK_PEAK, 0),)),
        ),
        interval="15s",
    ),
    RecordingScenario(
        "memory: one instance with two GPUs",
        {
            s(GPU_MEMORY_USED, gpu="0"): f"{40 * GIB}x4",
            s(GPU_MEMORY_TOTAL, gpu="0"): f"{80 * GIB}x4",
            s(GPU_MEMORY_USED, gpu="1"): f"{60 * GIB}x4",
            s(GPU_MEMORY_TOTAL, gpu="1"): f"{80 * GIB}x4",
            s(TORCH_RESERVED, device="cuda:0"): f"{36 * GIB}x4",
            s(TORCH_ALLOCATED, device="cuda:0"): f"{30 * GIB}x4",
            s(TORCH_DEVICE_TOTAL, device="cuda:0"): f"{80 * GIB}x4",
            s(TORCH_RESERVED, device="cuda:1"): f"{50 * GIB}x4",
            s(TORCH_ALLOCATED, device="cuda:1"): f"{48 * GIB}x4",
            s(TORCH_DEVICE_TOTAL, device="cuda:1"): f"{80 * GIB}x4",
        },
        (
            ExprCheck(
                "1m",
                rec.GPU_USED_RATIO,
                (at(rec.GPU_USED_RATIO, 0.5, gpu="0"), at(rec.GPU_USED_RATIO, 0.75, gpu="1")),
            ),
            ExprCheck(
                "1m",
                rec.TORCH_RESERVED_RATIO,
                (
                    at(rec.TORCH_RESERVED_RATIO, 0.45, device="cuda:0"),
                    at(rec.TORCH_RESERVED_RATIO, 0.625, device="cuda:1"),
                ),
            ),
            # the larger gap: 6 GiB on cuda:0 (2 GiB on cuda:1)
            ExprCheck("1m", rec.TORCH_CACHED, (at(rec.TORCH_CACHED, 6 * GIB),)),
            ExprCheck("1m", rec.TORCH_TOTAL, (at(rec.TORCH_TOTAL, 80 * GIB),)),
        ),
    ),
    RecordingScenario(
        "traffic: two engines, requests by outcome",
        {
            s(VLLM_NUM_REQUESTS_WAITING, engine="0"): "100x10",
            s(VLLM_NUM_REQUESTS_WAITING, engine="1"): "250x10",
            s(VLLM_NUM_PREEMPTIONS, engine="0"): "0+30x10",
            s(VLLM_NUM_PREEMPTIONS, engine="1"): "0+90x10",
            s(REQUESTS, outcome="success"): "0+540x10",
            s(REQUESTS, outcome="client_error"): "0+60x10",
            s(REQUESTS, outcome="server_error"): "0+120x10",
            s(REQUESTS, outcome="rejected"): "0+600x10",
            s(REQUEST_RETRIES, reason="oom"): "0+45x10",
            s(REQUEST_RETRIES, reason="cuda_driver"): "0+45x10",
            s(REQUEST_RETRIES_EXHAUSTED, reason="oom"): "0+22.5x10",
            s(NONFINITE_LOGITS, kind="nan"): "0+6x10",
            s(NONFINITE_LOGITS, kind="inf"): "0+1.2x10",
        },
        (
            ExprCheck("10m", rec.QUEUE_WAITING, (at(rec.QUEUE_WAITING, 350),)),
            # (30 + 90) a minute
            ExprCheck("10m", rec.PREEMPTIONS_RATE, (at(rec.PREEMPTIONS_RATE, 2),)),
            ExprCheck(
                "10m",
                rec.REQUESTS_BY_OUTCOME_RATE,
                (
                    at(rec.REQUESTS_BY_OUTCOME_RATE, 1, outcome="client_error"),
                    at(rec.REQUESTS_BY_OUTCOME_RATE, 10, outcome="rejected"),
                    at(rec.REQUESTS_BY_OUTCOME_RATE, 2, outcome="server_error"),
                    at(rec.REQUESTS_BY_OUTCOME_RATE, 9, outcome="success"),
                ),
            ),
            # served: everything but the rejected, 12 a second
            ExprCheck("10m", rec.REQUESTS_SERVED_RATE, (at(rec.REQUESTS_SERVED_RATE, 12),)),
            ExprCheck("10m", rec.SERVER_ERROR_RATIO, (at(rec.SERVER_ERROR_RATIO, 2 / 12),)),
            # ratios with exact binary fractions: promtool compares values exactly
            ExprCheck("10m", rec.RETRIES_RATIO, (at(rec.RETRIES_RATIO, 0.125),)),
            ExprCheck(
                "10m", rec.RETRIES_EXHAUSTED_RATIO, (at(rec.RETRIES_EXHAUSTED_RATIO, 0.03125),)
            ),
            ExprCheck("10m", rec.NONFINITE_RATE, (at(rec.NONFINITE_RATE, 0.12),)),
            ExprCheck("10m", rec.NONFINITE_RATIO, (at(rec.NONFINITE_RATIO, 0.01),)),
        ),
    ),
    RecordingScenario(
        "liveness: restarts and collector errors",
        {
            s(ENGINE_RESTARTS, reason="crash"): "0+1x90",
            s(ENGINE_RESTARTS, reason="stalled"): "0x90",
            s(COLLECTOR_ERRORS, collector="nvml"): "0+6x90",
            s(COLLECTOR_ERRORS, collector="cudagraph"): "0x90",
        },
        (
            ExprCheck("90m", rec.RESTARTS_1H, (at(rec.RESTARTS_1H, 60),)),
            ExprCheck(
                "90m",
                rec.COLLECTOR_ERRORS_RATE,
                (
                    at(rec.COLLECTOR_ERRORS_RATE, 0, collector="cudagraph"),
                    at(rec.COLLECTOR_ERRORS_RATE, 0.1, collector="nvml"),
                ),
            ),
        ),
    ),
)

TEST_FILES: tuple[TestFile, ...] = (
    TestFile("recording.yml", "1m", RECORDING_SCENARIOS),
    TestFile("memory.yml", "15s", MEMORY_SCENARIOS),
    TestFile("traffic.yml", "1m", BACKLOG_SCENARIOS + TRAFFIC_SCENARIOS),
    TestFile("faults.yml", "1m", FAULT_SCENARIOS),
    TestFile("liveness.yml", "1m", LIVENESS_SCENARIOS),
    TestFile("creep.yml", "1m", CREEP_SCENARIOS + CACHE_SCENARIOS + GRAPH_SCENARIOS),
)
