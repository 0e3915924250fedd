"""Memory: where device and host memory go, how fast they fill, and what warden does about it.

GPU panels (NVML, PyTorch allocator, CUDA graphs) are empty on a CPU engine; the risk, host
memory, KV cache and preemption panels work everywhere.
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from dashboards.layout import Row, warden_dashboard
from dashboards.overview import KV_STEPS, WATERMARK_NAMES
from dashboards.panels import (
    BAD,
    IDLE,
    OK,
    WARN,
    bar_gauge,
    gauge,
    stat,
    state_timeline,
    steps,
    target,
    timeseries,
    value_names,
)
from dashboards.queries import aggregate, increase, rate, selector
from exporter.catalog import (
    CUDAGRAPH_CAPTURES,
    CUDAGRAPH_POOL_BYTES,
    GPU_MEMORY_ENGINE_USED,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    HOST_MEMORY_LIMIT,
    HOST_MEMORY_PLANNED,
    HOST_MEMORY_USED,
    MEMORY_DEVICE_RISK_SCOPE,
    MEMORY_PLANNED,
    MEMORY_RESTART_RISK,
    MEMORY_RISK,
    MEMORY_UTILIZATION,
    MEMORY_WATERMARK,
    MEMORY_WATERMARK_PEAK,
    SOURCE_AVAILABLE,
    TORCH_ALLOC_RETRIES,
    TORCH_ALLOCATED,
    TORCH_DEVICE_TOTAL,
    TORCH_OOM,
    TORCH_RESERVED,
    VLLM_KV_CACHE_USAGE,
    VLLM_NUM_PREEMPTIONS,
    WARDEN_PREEMPTIONS,
    WATERMARK_TRANSITIONS,
)

UID = "warden-memory"
TITLE = "vLLM Warden / Memory"

# Fit window for growth projections: long enough to ignore batch-to-batch noise.
TREND_WINDOW = "15m"
# Projections look this far ahead; the time-to-OOM stat is capped here too.
HORIZON_SECONDS = 3600
# Events per second, the unit of preemption rates.
EVENTS_PER_SECOND = "cps"

UTILIZATION_STEPS = steps((OK, None), (WARN, 0.85), (BAD, 0.95))


def cached_gap() -> str:
    """Bytes PyTorch holds in its cache but no tensor uses: reclaimable, or fragmented."""
    return f"{selector(TORCH_RESERVED)} - {selector(TORCH_ALLOCATED)}"


def fragmentation_ratio() -> str:
    """Share of reserved memory not backing a live tensor (NaN before anything is reserved)."""
    return f"1 - ({selector(TORCH_ALLOCATED)} / {selector(TORCH_RESERVED)})"


def time_to_oom() -> str:
    """Seconds until the fastest-filling source reaches 100% at its current trend.

    deriv() is the same least-squares slope predict_linear() extrapolates with. Flat or
    shrinking usage reads as the cap (``HORIZON_SECONDS``), not as infinity.
    """
    utilization = selector(MEMORY_UTILIZATION)
    slope = f"clamp_min(deriv({utilization}[{TREND_WINDOW}]), 1e-12)"
    return f"min(clamp_max((1 - {utilization}) / {slope}, {HORIZON_SECONDS}))"


def projected_utilization() -> str:
    """Where each source's utilization will be in ``HORIZON_SECONDS`` at its current trend."""
    fit = f"predict_linear({selector(MEMORY_UTILIZATION)}[{TREND_WINDOW}], {HORIZON_SECONDS})"
    # Clamped to 0-200%: past "full" the exact overshoot means nothing, and a short noisy
    # history would otherwise swamp the axis.
    return aggregate("max", f"clamp({fit}, 0, 2)", ["source"])


def headline_row() -> Row:
    watermark = stat(
        "Memory watermark",
        "Worst memory pressure level. Normal: 'normal'. It is the maximum over the sources "
        "below, so the utilization panels show which source drives it.",
        [target(aggregate("max", selector(MEMORY_WATERMARK)))],
        MEMORY_WATERMARK.unit,
        mappings=WATERMARK_NAMES,
        sparkline=False,
    )
    oom = stat(
        "Projected time to OOM",
        f"Time until the fastest-growing memory source is full, from its trend over the last "
        f"{TREND_WINDOW}. Normal: 1 hour (the cap: flat or shrinking usage). Under 10 minutes "
        "means a leak or a runaway batch.",
        [target(time_to_oom())],
        "s",
        thresholds=steps((BAD, None), (WARN, 600), (OK, HORIZON_SECONDS)),
        sparkline=False,
    )
    fragmentation = gauge(
        "Fragmentation",
        "Share of PyTorch's reserved memory that no tensor uses (1 - allocated/reserved), worst "
        "device. Normal: under 20%; high values mean cached blocks too small to reuse.",
        [target(aggregate("max", fragmentation_ratio()))],
        "percentunit",
        minimum=0,
        maximum=1,
        thresholds=steps((OK, None), (WARN, 0.2), (BAD, 0.4)),
    )
    kv = gauge(
        "KV cache usage",
        "Fullest KV cache. Under load 50-80% is healthy; near 100% the scheduler preempts.",
        [target(aggregate("max", selector(VLLM_KV_CACHE_USAGE)))],
        VLLM_KV_CACHE_USAGE.unit,
        minimum=0,
        maximum=1,
        thresholds=KV_STEPS,
    )
    preemptions = stat(
        "Preemptions (5 min)",
        "Requests the scheduler preempted in the last 5 minutes (their KV blocks were freed and "
        "they restart later). Normal: 0; bursts mean the KV cache is too small for the load.",
        [target(increase(VLLM_NUM_PREEMPTIONS))],
        VLLM_NUM_PREEMPTIONS.unit,
        thresholds=steps((OK, None), (WARN, 1), (BAD, 50)),
    )
    return Row(4, [(4, watermark), (5, oom), (5, fragmentation), (5, kv), (5, preemptions)])


def device_row() -> Row:
    device = timeseries(
        "Device memory used vs total (NVML)",
        "GPU memory in use by every process and by this engine's own processes (where NVML "
        "gives per-process usage), against the device size. Normal: flat after start-up (vLLM "
        "preallocates); growth of 'used' alone is another process, of both a leak here.",
        [
            target(aggregate("max", selector(GPU_MEMORY_USED), ["gpu"]), "used gpu {{gpu}}"),
            target(
                aggregate("max", selector(GPU_MEMORY_ENGINE_USED), ["gpu"]),
                "this engine gpu {{gpu}}",
            ),
            target(aggregate("max", selector(GPU_MEMORY_TOTAL), ["gpu"]), "total gpu {{gpu}}"),
        ],
        GPU_MEMORY_USED.unit,
    )
    torch = timeseries(
        "PyTorch reserved vs allocated",
        "What the caching allocator took from the device (reserved), what live tensors use "
        "(allocated), the cached gap between them, and the device size. Normal: a small, "
        "stable gap.",
        [
            target(aggregate("max", selector(TORCH_RESERVED), ["device"]), "reserved {{device}}"),
            target(aggregate("max", selector(TORCH_ALLOCATED), ["device"]), "allocated {{device}}"),
            target(aggregate("max", cached_gap(), ["device"]), "cached gap {{device}}"),
            target(aggregate("max", selector(TORCH_DEVICE_TOTAL), ["device"]), "device {{device}}"),
        ],
        TORCH_RESERVED.unit,
    )
    return Row(8, [(12, device), (12, torch)])


def utilization_row() -> Row:
    by_source_now = bar_gauge(
        "Utilization by source",
        "Used fraction of each memory signal now: device (NVML), torch_reserved, kv_cache. "
        "Normal: below 85%; the watermark follows the fullest one.",
        [
            target(
                aggregate("max", selector(MEMORY_UTILIZATION), ["source"]),
                "{{source}}",
                instant=True,
            )
        ],
        MEMORY_UTILIZATION.unit,
        minimum=0,
        maximum=1,
        thresholds=UTILIZATION_STEPS,
    )
    by_source = timeseries(
        "Utilization by source over time",
        "Used fraction per memory signal. Normal: flat lines below 85%; a steady climb on one "
        "source is what the time-to-OOM projection extrapolates.",
        [target(aggregate("max", selector(MEMORY_UTILIZATION), ["source"]), "{{source}}")],
        MEMORY_UTILIZATION.unit,
        maximum=1,
        thresholds=UTILIZATION_STEPS,
    )
    projected = timeseries(
        "Projected utilization in 1 h",
        f"predict_linear over the last {TREND_WINDOW}: where each source would be in an hour "
        "at its current trend (shown between 0 and 200%). Normal: below 100%; above it, the "
        "source runs out within the hour.",
        [target(projected_utilization(), "{{source}}")],
        MEMORY_UTILIZATION.unit,
        minimum=None,
        thresholds=steps((OK, None), (BAD, 1)),
    )
    return Row(8, [(6, by_source_now), (10, by_source), (8, projected)])


def risk_row() -> Row:
    """What the watermark reads: memory beyond the engine's own plan, not raw used/total."""
    risk = timeseries(
        "Memory beyond the plan (risk)",
        "Memory in use beyond what the engine planned at start-up, as a share of the headroom "
        "the plan left: device (NVML: this engine's processes, or the whole device where NVML "
        "cannot say; the device-risk panel tells which) and allocator (PyTorch reserved) on a "
        "GPU, host (the engine processes' own memory against their limit) everywhere. Normal: "
        "0 at any load and any gpu_memory_utilization; high 80%, critical 90%, oom_imminent "
        "97%. 'restart at': the risk at which the supervisor drains and restarts the engine, "
        "lower while it remembers a creep that came back (undo: DELETE /supervisor/memory).",
        [
            target(aggregate("max", selector(MEMORY_RISK), ["instance", "source"]), "{{source}}"),
            target(
                aggregate("min", selector(MEMORY_RESTART_RISK), ["instance", "source"]),
                "restart at ({{source}})",
            ),
        ],
        MEMORY_RISK.unit,
        maximum=1,
        thresholds=steps((OK, None), (WARN, 0.8), (BAD, 0.9)),
    )
    planned = timeseries(
        "Planned footprint",
        "Device memory the engine planned to use (vLLM's budget plus what was in use before, "
        "or the peak it settled at). Normal: flat from start-up on.",
        [target(aggregate("max", selector(MEMORY_PLANNED), ["gpu"]), "gpu {{gpu}}")],
        MEMORY_PLANNED.unit,
    )
    scope = stat(
        "Device risk counts",
        "Whose memory the device risk counts, per GPU: this engine's own processes (NVML per "
        "process; a neighbour on a shared GPU does not move it) or the whole device (NVML gives "
        "no per-process usage here: every process counts).",
        [target(aggregate("max", selector(MEMORY_DEVICE_RISK_SCOPE), ["gpu"]), "gpu {{gpu}}")],
        MEMORY_DEVICE_RISK_SCOPE.unit,
        mappings=value_names(("whole device", "this engine"), (WARN, OK)),
        sparkline=False,
    )
    return Row(8, [(11, risk), (4, scope), (9, planned)])


def host_row() -> Row:
    """The engine processes' host memory: what kills a pod or a VM, on GPU and CPU alike."""
    host = timeseries(
        "Host memory of the engine",
        "Unique memory of the engine's processes (API server, engine core, workers; shared "
        "pages once), the footprint it settled at after start-up, and the limit that would "
        "stop it (cgroup, declared or machine less a reserve). Normal: used flat at the "
        "settled footprint; a climb toward the limit is a host memory creep.",
        [
            target(aggregate("max", selector(HOST_MEMORY_USED), ["instance"]), "used"),
            target(aggregate("max", selector(HOST_MEMORY_PLANNED), ["instance"]), "settled"),
            target(
                aggregate("max", selector(HOST_MEMORY_LIMIT), ["instance", "limit"]),
                "limit ({{limit}})",
            ),
        ],
        HOST_MEMORY_USED.unit,
    )
    return Row(8, [(24, host)])


def pressure_row() -> Row:
    fragmentation = timeseries(
        "Fragmentation ratio",
        "1 - allocated/reserved per device. Normal: under 20% and steady; a rising ratio with "
        "allocation retries means the cache holds blocks of the wrong sizes.",
        [target(aggregate("max", fragmentation_ratio(), ["device"]), "{{device}}")],
        "percentunit",
        maximum=1,
        thresholds=steps((OK, None), (WARN, 0.2), (BAD, 0.4)),
    )
    kv = timeseries(
        "KV cache usage",
        "KV cache fill per engine. Reaching 100% under load means preemptions (next panel).",
        [
            target(
                aggregate("max", selector(VLLM_KV_CACHE_USAGE), ["instance", "model_name"]),
                "{{model_name}} @ {{instance}}",
            )
        ],
        VLLM_KV_CACHE_USAGE.unit,
        maximum=1,
        thresholds=KV_STEPS,
    )
    preemptions = timeseries(
        "Preemptions",
        "Requests preempted per second, by vLLM's scheduler (KV cache full) and by warden to "
        "relieve memory pressure. Normal: 0.",
        [
            target(rate(VLLM_NUM_PREEMPTIONS), "scheduler"),
            target(rate(WARDEN_PREEMPTIONS), "warden"),
        ],
        EVENTS_PER_SECOND,
    )
    return Row(8, [(8, fragmentation), (8, kv), (8, preemptions)])


def cudagraph_row() -> Row:
    captures = stat(
        "CUDA graph captures",
        "CUDA graphs captured since start. Normal: a fixed number reached at start-up; growth "
        "while serving means lazy captures, each taking pool memory.",
        [target(aggregate("sum", selector(CUDAGRAPH_CAPTURES)))],
        CUDAGRAPH_CAPTURES.unit,
    )
    pool = timeseries(
        "CUDA graph pool memory",
        "Device memory held by captured CUDA graphs. Normal: flat after start-up.",
        [target(aggregate("sum", selector(CUDAGRAPH_POOL_BYTES), ["instance"]), "{{instance}}")],
        CUDAGRAPH_POOL_BYTES.unit,
    )
    allocator = timeseries(
        "Allocator retries and OOMs (5 min)",
        "Allocations that only succeeded after PyTorch flushed its cache, and allocations that "
        "failed. Normal: 0; retries come before OOMs.",
        [
            target(increase(TORCH_ALLOC_RETRIES, ["device"]), "retries {{device}}"),
            target(increase(TORCH_OOM, ["device"]), "OOM {{device}}"),
        ],
        TORCH_ALLOC_RETRIES.unit,
        bars=True,
    )
    return Row(8, [(4, captures), (10, pool), (10, allocator)])


def sources_row() -> Row:
    available = state_timeline(
        "Measurement sources",
        "Which memory signals warden can read on each engine. On a GPU: all available. On a "
        "CPU engine kv_cache and host_memory are; GPU panels above stay empty there.",
        [target(aggregate("max", selector(SOURCE_AVAILABLE), ["source"]), "{{source}}")],
        SOURCE_AVAILABLE.unit,
        mappings=value_names(("unavailable", "available"), (IDLE, OK)),
    )
    transitions = timeseries(
        "Watermark transitions (5 min)",
        "Changes of the memory watermark, by the level entered. Normal: none; frequent "
        "back-and-forth means thresholds sit too close to the working set.",
        [target(increase(WATERMARK_TRANSITIONS, ["to"]), "to {{to}}")],
        WATERMARK_TRANSITIONS.unit,
        bars=True,
    )
    peak = timeseries(
        "Watermark: now and recent peak",
        "The level now, and the highest level of the last peak window (15 s by default). "
        "Normal: both 0. A peak above the current level means the reflex is absorbing spikes "
        "between scrapes; the memory alerts read the peak.",
        [
            target(aggregate("max", selector(MEMORY_WATERMARK)), "now"),
            target(aggregate("max", selector(MEMORY_WATERMARK_PEAK)), "peak"),
        ],
        MEMORY_WATERMARK_PEAK.unit,
    )
    return Row(6, [(8, available), (8, transitions), (8, peak)])


def dashboard() -> Dashboard:
    return warden_dashboard(
        UID,
        TITLE,
        "Device, allocator, host and KV cache memory: usage, trends, time to OOM, "
        "fragmentation, CUDA graphs, preemptions and the supervisor's memory restarts.",
        [
            headline_row(),
            device_row(),
            risk_row(),
            host_row(),
            utilization_row(),
            pressure_row(),
            cudagraph_row(),
            sources_row(),
        ],
    )
