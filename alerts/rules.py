"""The alerting rules: what is wrong, how bad, and which degradation the engine should apply.

Thresholds and holds come from the alerts config (``alerts.thresholds.Thresholds``, the
``thresholds`` of a mixin config), so a deployment tunes them without editing rules; the runbook's
"how to tune" sections name those fields. What stays here is the shape of each rule. Alerts
that drive degradation carry ``warden_action`` plus its parameter labels (see
``exporter.catalog``); the engine webhook turns each firing one into a lease and drops the lease
when the resolved notification arrives or the lease expires.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from alerts import fleet
from alerts import recording as rec
from alerts.config import (
    DASHBOARD_FAULTS,
    DASHBOARD_MEMORY,
    DASHBOARD_OVERVIEW,
    MixinConfig,
    Severity,
    Templated,
)
from alerts.durations import spoken
from alerts.model import AlertRule, RuleGroup
from alerts.thresholds import Thresholds
from exporter.catalog import (
    CUDAGRAPH_POOL_BYTES,
    ENGINE_HEALTHY,
    ENGINE_STALLED,
    NONFINITE_LOGITS,
    PARAM_ADMIT_FRACTION,
    PARAM_CIRCUIT,
    PARAM_PREEMPT,
    PARAM_PRIORITY_THRESHOLD,
    PARAM_RETRY_AFTER,
    WATERMARK_LEVELS,
)

# --- Memory watermark ---------------------------------------------------------------------
# Levels of warden_memory_watermark and its peak: the memory risk (exporter/memory_risk.py),
# memory in use beyond the engine's own plan as a share of the headroom that plan left on the
# device. A healthy engine at any gpu_memory_utilization reads 0; a full KV cache is no risk.
# The rules use ">=" so stronger measures add to weaker ones (at oom_imminent the engine holds
# shed + preempt and reject_all at once). ``high`` pages nobody and takes no action: it is the
# early warning of a creep that will take hours; the engine's reflex and these alerts act from
# ``critical``.
LEVEL_HIGH = WATERMARK_LEVELS.index("high")
LEVEL_CRITICAL = WATERMARK_LEVELS.index("critical")
LEVEL_OOM_IMMINENT = WATERMARK_LEVELS.index("oom_imminent")
# Larger priority number = less important; shedding refuses priority > threshold. vLLM's
# default priority is 0, so "0" sheds only traffic explicitly marked as less important.
SHED_PRIORITY_THRESHOLD = "0"
OOM_RETRY_AFTER_S = "30"

# The memory alerts compare rec.WATERMARK_PEAK: the max over rec.WATERMARK_PEAK_WINDOW (1m) of
# the exporter's warden_memory_watermark_peak (the highest level of its last 15s), not the
# current level: the engine's reflex can push the level back down (a preemption frees memory),
# and a scrape must not miss a level the engine reached between two scrapes. The engine holds a
# level 20 s before stepping down (WARDEN_WATERMARK_HOLD_S), so the level does not flap. One
# spike holds the record up for one window plus the exporter's peak window (1m15s), so each
# ``for`` (thresholds.watermark_high_for, watermark_critical_for, oom_imminent_for) must be
# LONGER than that or a single spike the reflex handled would fire. An alert fires when its level
# is reached at least once in every window for longer than ``for``: held, or recurring (at most
# a window apart) over ``for`` minus the window (1m for high and critical, 30s for
# oom_imminent, with the default holds). It resolves one window after the peak gauge last showed
# the level.


def _watermark_description(effect: str) -> str:
    return (
        "Memory on {{ $labels.instance }} beyond the engine's plan reached watermark level "
        '{{ printf "%.0f" $value }} (1 high, 2 critical, 3 oom_imminent) within the last '
        f"{spoken(rec.WATERMARK_PEAK_WINDOW)}; " + effect
    )


MEMORY = RuleGroup(
    "warden-memory",
    (
        AlertRule(
            name="WardenMemoryWatermarkHigh",
            expr=f"{rec.WATERMARK_PEAK} >= {LEVEL_HIGH}",
            for_=lambda c: c.thresholds.watermark_high_for,
            severity="warning",
            summary="Engine memory has grown well beyond its plan.",
            description=_watermark_description(
                "most of the headroom its plan left on the device is used. Nothing is refused "
                "yet; find the growth before it reaches critical."
            ),
            dashboard=DASHBOARD_MEMORY,
        ),
        AlertRule(
            name="WardenMemoryWatermarkCritical",
            expr=f"{rec.WATERMARK_PEAK} >= {LEVEL_CRITICAL}",
            for_=lambda c: c.thresholds.watermark_critical_for,
            severity="critical",
            action="shed_low_priority",
            params={PARAM_PRIORITY_THRESHOLD: SHED_PRIORITY_THRESHOLD, PARAM_PREEMPT: "1"},
            summary="Engine memory is critical; warden sheds low-priority work and preempts.",
            description=_watermark_description(
                "warden refuses low-priority requests and preempts the largest running one."
            ),
            dashboard=DASHBOARD_MEMORY,
        ),
        AlertRule(
            name="WardenOOMImminent",
            expr=f"{rec.WATERMARK_PEAK} >= {LEVEL_OOM_IMMINENT}",
            for_=lambda c: c.thresholds.oom_imminent_for,
            severity="critical",
            action="reject_all",
            params={PARAM_RETRY_AFTER: OOM_RETRY_AFTER_S},
            summary="Engine is about to run out of memory; warden rejects all new requests.",
            description=_watermark_description(
                "warden rejects every new request with Retry-After to avoid an out-of-memory crash."
            ),
            dashboard=DASHBOARD_MEMORY,
        ),
    ),
)


# --- Memory creep -------------------------------------------------------------------------
@dataclass(frozen=True)
class CreepHorizon:
    """How far ahead TimeToOOM looks at one severity, and what it demands of the series.

    The series is the memory risk (memory beyond the engine's plan, 1 = device full): 0 while
    the engine keeps to its plan, start-up and a full KV cache included, so only growth beyond
    the plan can project to 1. The long window gives the trend; the short window must agree, so
    growth that already stopped does not count; the lowest risk over the long window must be
    above ``thresholds.time_to_oom_floor``: some of the margin used all along, not a blip.
    ``for_`` picks the rule's hold from the thresholds.
    """

    severity: Severity
    horizon: str
    horizon_seconds: int
    long_window: str
    short_window: str
    for_: Callable[[MixinConfig], str]


TIME_TO_OOM_WARNING = CreepHorizon(
    "warning", "6h", 6 * 3600, "2h", "30m", lambda c: c.thresholds.time_to_oom_warning_for
)
TIME_TO_OOM_CRITICAL = CreepHorizon(
    "critical", "1h", 3600, "1h", "15m", lambda c: c.thresholds.time_to_oom_critical_for
)


def _reaches_full(ratio: str, h: CreepHorizon, c: MixinConfig) -> str:
    return (
        f"predict_linear({ratio}[{h.long_window}], {h.horizon_seconds}) >= 1\n"
        f"and predict_linear({ratio}[{h.short_window}], {h.horizon_seconds}) >= 1\n"
        f"and min_over_time({ratio}[{h.long_window}]) > {c.thresholds.time_to_oom_floor}"
    )


def _time_to_oom(h: CreepHorizon) -> AlertRule:
    # One series per engine and risk source (device, allocator: catalog.MEMORY_RISK_SOURCES),
    # the share of the headroom the engine's plan left that is in use (1 = the device is full).
    return AlertRule(
        name="WardenTimeToOOM",
        expr=lambda c: _reaches_full(rec.MEMORY_RISK_MAX, h, c),
        for_=h.for_,
        severity=h.severity,
        summary="Memory beyond the engine's plan keeps growing and will fill the device.",
        description=(
            "{{ $labels.source }} memory on {{ $labels.instance }} keeps growing beyond the "
            "engine's plan; at this rate it reaches "
            f"{{{{ $value | humanizePercentage }}}} of the headroom within {h.horizon} "
            "(100% = the device is full)."
        ),
        dashboard=DASHBOARD_MEMORY,
    )


# A fast creep (a leak under load, vLLM #50150: workers' host memory grows to the pod's limit
# within minutes to hours) is past the slow horizons' windows before they could judge it. This
# rule reads the rate of the last minute, agreed by the trend of the last 5, with some of the
# margin used for 30 s (above thresholds.time_to_oom_fast_floor), and its value is the time left
# at that rate: the estimate a person paged needs. Its own ``horizon`` label tells it from the
# 1 h critical rule.
FAST_HORIZON = "10m"
FAST_HORIZON_SECONDS = 600
FAST_RATE_WINDOW = "1m"
FAST_TREND_WINDOW = "5m"
FAST_FLOOR_WINDOW = "30s"


def _time_to_oom_fast() -> AlertRule:
    risk = rec.MEMORY_RISK_MAX

    def expr(c: MixinConfig) -> str:
        floor = c.thresholds.time_to_oom_fast_floor
        return (
            f"(1 - {risk}) / (deriv({risk}[{FAST_RATE_WINDOW}]) > 0) < {FAST_HORIZON_SECONDS}\n"
            f"and deriv({risk}[{FAST_TREND_WINDOW}]) > 0\n"
            f"and min_over_time({risk}[{FAST_FLOOR_WINDOW}]) > {floor}"
        )

    return AlertRule(
        name="WardenTimeToOOM",
        expr=expr,
        for_=lambda c: c.thresholds.time_to_oom_fast_for,
        severity="critical",
        extra_labels={"horizon": FAST_HORIZON},
        summary="Memory beyond the engine's plan grows fast and will be exhausted within minutes.",
        description=(
            "{{ $labels.source }} memory on {{ $labels.instance }} grows fast beyond the "
            "engine's plan; at the rate of the last minute the headroom is gone in "
            "{{ $value | humanizeDuration }} (the supervisor drains and restarts the engine "
            "before that)."
        ),
        dashboard=DASHBOARD_MEMORY,
    )


def _indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line for line in text.splitlines())


def _steady_for(c: MixinConfig, window: str) -> str:
    """The engine target has been scraped for at least ``window`` and answered every scrape in
    it: no start-up and no restart inside the window.

    Memory moves a lot while an engine starts and warms up; growth alerts judge steady state.
    """
    up = c.select("up")
    return f"(min_over_time({up}[{window}]) == 1 and {up} offset {window})"


# The window over which the cached gap (reserved - allocated) must keep growing to count as a
# leak (thresholds.cache_growth_bytes_per_hour, cache_gap_floor_ratio: how fast, how big).
CACHE_GROWTH_WINDOW = "2h"


def _cache_growth(c: MixinConfig) -> str:
    t = c.thresholds
    return (
        f"deriv({rec.TORCH_CACHED}[{CACHE_GROWTH_WINDOW}]) * 3600"
        f" > {t.cache_growth_bytes_per_hour}\n"
        f"and deriv({rec.TORCH_CACHED}[30m]) > 0\n"
        f"and {rec.TORCH_CACHED} / {rec.TORCH_TOTAL} > {t.cache_gap_floor_ratio}"
    )


# The eager fallback: PyTorch memory creeping (the cache growth or time-to-OOM condition) on an
# engine that runs CUDA graphs. vLLM captures graphs at start-up only, so captures never grow
# later; what operators see with graphs on is reserved memory outgrowing allocated for hours,
# which --enforce-eager stops at a cost in throughput. Held thresholds.eager_fallback_for before
# the restart.
def _eager_fallback() -> AlertRule:
    def expr(c: MixinConfig) -> str:
        cache_growth = _cache_growth(c)
        reserved_full = _reaches_full(rec.TORCH_RESERVED_RATIO, TIME_TO_OOM_WARNING, c)
        return (
            f"# CUDA graphs on: vLLM captured a graph pool at start-up (0 or absent when eager)\n"
            f"max {c.by()} ({c.select(CUDAGRAPH_POOL_BYTES)}) > 0\n"
            f"and {c.on()} (\n"
            f"  # the allocator cache keeps growing, as for WardenAllocatorCacheGrowth\n"
            f"  max {c.by()} (\n{_indent(cache_growth, '    ')}\n  )\n"
            f"  or\n"
            f"  # PyTorch reserved memory full within {TIME_TO_OOM_WARNING.horizon} at its rate\n"
            f"  max {c.by()} (\n{_indent(reserved_full, '    ')}\n  )\n"
            f")\n"
            f"# not a warm-up: the engine was scraped without a gap for the whole window\n"
            f"and {c.on()} {_steady_for(c, CACHE_GROWTH_WINDOW)}"
        )

    return AlertRule(
        name="WardenMemoryCreepWithCudaGraphs",
        expr=expr,
        for_=lambda c: c.thresholds.eager_fallback_for,
        severity="warning",
        action="enforce_eager",
        summary="PyTorch memory keeps growing on an engine with CUDA graphs; warden restarts it "
        "eager.",
        description=(
            "{{ $labels.instance }} runs CUDA graphs ({{ $value | humanize1024 }}B of graph pool) "
            "and PyTorch's reserved memory keeps outgrowing what it uses (allocator cache growth, "
            f"or reserved memory projected full within {TIME_TO_OOM_WARNING.horizon}); the "
            "supervisor restarts vLLM with --enforce-eager."
        ),
        dashboard=DASHBOARD_MEMORY,
    )


CREEP = RuleGroup(
    "warden-creep",
    (
        _time_to_oom(TIME_TO_OOM_WARNING),
        _time_to_oom(TIME_TO_OOM_CRITICAL),
        _time_to_oom_fast(),
        AlertRule(
            name="WardenAllocatorCacheGrowth",
            expr=lambda c: (
                f"{_cache_growth(c)}\n"
                f"# not a warm-up: the engine was scraped without a gap for the whole window\n"
                f"and {c.on()} {_steady_for(c, CACHE_GROWTH_WINDOW)}"
            ),
            for_=lambda c: c.thresholds.allocator_cache_growth_for,
            severity="warning",
            summary="PyTorch's allocator cache (reserved minus allocated) keeps growing.",
            description=(
                "Memory PyTorch reserved but does not use on {{ $labels.instance }} grows by "
                "{{ $value | humanize1024 }}B per hour (fragmentation or a leak in the cache)."
            ),
            dashboard=DASHBOARD_MEMORY,
        ),
        _eager_fallback(),
    ),
)


# --- Traffic and saturation ---------------------------------------------------------------
# A saturated engine (batch full, KV cache near 100%, a preemption now and then) is vLLM at its
# most efficient and alerts nobody. What does: admission refusing requests because a typical one
# would miss the latency SLO (the engine's warden_saturated, held 20 s), a queue wait users feel
# (vLLM's own queue-time histogram, for engines without an SLO set), and recomputation eating
# the throughput (preemptions per finished request).


def _saturated(severity: Severity) -> AlertRule:
    critical = severity == "critical"
    saturated = f"{rec.SATURATED_1M} == 1"
    # critical: the refused share first, it is the value the description shows
    expr: Templated = (
        (
            lambda c: (
                f"{rec.REJECTED_RATIO} > {c.thresholds.saturated_refused_ratio:g}\n"
                f"and {c.on()} {saturated}"
            )
        )
        if critical
        else saturated
    )
    return AlertRule(
        name="WardenSaturated",
        expr=expr,
        for_=lambda c: (
            c.thresholds.saturated_critical_for if critical else c.thresholds.saturated_for
        ),
        keep_firing_for=lambda c: c.thresholds.saturated_keep_firing_for,
        severity=severity,
        action="shed_low_priority",
        params={PARAM_PRIORITY_THRESHOLD: SHED_PRIORITY_THRESHOLD},
        summary=(
            "Most requests are refused: the engine is overloaded beyond its latency SLO."
            if critical
            else "The engine is saturated: warden refuses what would miss the latency SLO."
        ),
        description=(
            "{{ $labels.instance }} is saturated: a new request would miss its latency SLO or "
            "queue limit, so warden refuses it with a Retry-After computed from the drain rate"
            + (
                " ({{ $value | humanizePercentage }} of requests refused over 5 minutes)"
                if critical
                else " (saturated = {{ $value }})"
            )
            + "; low-priority requests are shed."
        ),
        dashboard=DASHBOARD_OVERVIEW,
    )


HALF_OPEN_ADMIT_FRACTION = "0.5"


def _with_traffic(expr: Callable[[Thresholds], str]) -> Templated:
    """``expr`` (of the thresholds), only where the engine serves enough requests for a ratio
    to mean something (thresholds.min_served_per_second)."""
    return lambda c: (
        f"{expr(c.thresholds)}\n"
        f"and {c.on()} ({rec.REQUESTS_SERVED_RATE} >= {c.thresholds.min_served_per_second})"
    )


TRAFFIC = RuleGroup(
    "warden-traffic",
    (
        _saturated("warning"),
        _saturated("critical"),
        AlertRule(
            name="WardenQueueWaitHigh",
            expr=lambda c: f"{rec.QUEUE_TIME_P90} > {c.thresholds.queue_time_p90_seconds}",
            for_=lambda c: c.thresholds.queue_wait_for,
            severity="warning",
            summary="Requests wait long in vLLM's queue before they start.",
            description=(
                "90% of requests on {{ $labels.instance }} waited up to "
                '{{ printf "%.0f" $value }} s in the queue over 5 minutes; set a latency SLO '
                "(admission.saturation) to refuse what would miss it instead."
            ),
            dashboard=DASHBOARD_OVERVIEW,
        ),
        AlertRule(
            name="WardenPreemptionStorm",
            expr=lambda c: f"{rec.RECOMPUTE_RATIO} > {c.thresholds.recompute_per_finished}",
            for_=lambda c: c.thresholds.preemption_storm_for,
            severity="warning",
            summary="vLLM recomputes more than it finishes: the KV cache is oversubscribed.",
            description=(
                'vLLM on {{ $labels.instance }} preempts {{ printf "%.2f" $value }} requests '
                "per finished request; their work is recomputed, so throughput collapses."
            ),
            dashboard=DASHBOARD_OVERVIEW,
        ),
        AlertRule(
            name="WardenErrorRateHigh",
            expr=_with_traffic(lambda t: f"{rec.SERVER_ERROR_RATIO} > {t.error_ratio_half_open}"),
            for_=lambda c: c.thresholds.error_half_open_for,
            keep_firing_for=lambda c: c.thresholds.error_half_open_keep_firing_for,
            severity="warning",
            action="circuit_breaker",
            params={PARAM_CIRCUIT: "half_open", PARAM_ADMIT_FRACTION: HALF_OPEN_ADMIT_FRACTION},
            summary="Many requests fail with server errors; the circuit breaker is half open.",
            description=(
                "{{ $value | humanizePercentage }} of requests served on "
                "{{ $labels.instance }} ended in a server error; warden admits only half of "
                "new requests."
            ),
            dashboard=DASHBOARD_FAULTS,
        ),
        AlertRule(
            name="WardenErrorRateHigh",
            expr=_with_traffic(lambda t: f"{rec.SERVER_ERROR_RATIO} > {t.error_ratio_open}"),
            for_=lambda c: c.thresholds.error_open_for,
            keep_firing_for=lambda c: c.thresholds.error_open_keep_firing_for,
            severity="critical",
            action="circuit_breaker",
            params={PARAM_CIRCUIT: "open"},
            summary="Most requests fail with server errors; the circuit breaker is open.",
            description=(
                "{{ $value | humanizePercentage }} of requests served on "
                "{{ $labels.instance }} ended in a server error; warden rejects new requests "
                "until the breaker cools down."
            ),
            dashboard=DASHBOARD_FAULTS,
        ),
    ),
)


# --- Faults -------------------------------------------------------------------------------
def _nonfinite_widespread_or_sustained(c: MixinConfig) -> str:
    sustained = c.thresholds.nonfinite_sustained
    return (
        f"{rec.NONFINITE_RATIO} > {c.thresholds.nonfinite_widespread_ratio}\n"
        f"or\n"
        f"(\n"
        f"  {rec.NONFINITE_RATIO} > 0\n"
        f"  and min_over_time({rec.NONFINITE_RATE}[{sustained}]) > 0\n"
        f"  and {rec.NONFINITE_RATE} offset {sustained} > 0\n"
        f")"
    )


FAULTS = RuleGroup(
    "warden-faults",
    (
        AlertRule(
            name="WardenNonFiniteLogits",
            expr=lambda c: f"sum {c.by()} (increase({c.select(NONFINITE_LOGITS)}[10m])) > 0",
            for_=lambda c: c.thresholds.nonfinite_for,
            severity="warning",
            summary="Some requests produced NaN or Inf logits.",
            description=(
                '{{ printf "%.0f" $value }} requests on {{ $labels.instance }} produced NaN or '
                "Inf logits in the last 10 minutes."
            ),
            dashboard=DASHBOARD_FAULTS,
        ),
        AlertRule(
            name="WardenNonFiniteLogits",
            expr=_nonfinite_widespread_or_sustained,
            for_=lambda c: c.thresholds.nonfinite_critical_for,
            severity="critical",
            summary="NaN or Inf logits are widespread or persistent: weight corruption suspected.",
            description=lambda c: (
                "{{ $value | humanizePercentage }} of requests on {{ $labels.instance }} "
                "produced NaN or Inf logits over 5 minutes, and it is widespread or has lasted "
                f"{spoken(c.thresholds.nonfinite_sustained)}: suspect corrupted weights or a "
                "failing device."
            ),
            dashboard=DASHBOARD_FAULTS,
        ),
        AlertRule(
            name="WardenRequestRetriesHigh",
            expr=_with_traffic(lambda t: f"{rec.RETRIES_RATIO} > {t.retry_ratio}"),
            for_=lambda c: c.thresholds.retry_for,
            severity="warning",
            summary="Warden retries many requests after transient failures.",
            description=(
                "Retries on {{ $labels.instance }} amount to {{ $value | humanizePercentage }} "
                "of requests served."
            ),
            dashboard=DASHBOARD_FAULTS,
        ),
        AlertRule(
            name="WardenRequestRetriesHigh",
            expr=_with_traffic(
                lambda t: f"{rec.RETRIES_EXHAUSTED_RATIO} > {t.retry_exhausted_ratio}"
            ),
            for_=lambda c: c.thresholds.retry_exhausted_for,
            severity="critical",
            summary="Warden retries many requests after transient failures.",
            description=(
                "{{ $value | humanizePercentage }} of requests served on {{ $labels.instance }} "
                "still failed after their last retry."
            ),
            dashboard=DASHBOARD_FAULTS,
        ),
        AlertRule(
            name="WardenCollectorErrors",
            expr=f"{rec.COLLECTOR_ERRORS_RATE} > 0",
            for_=lambda c: c.thresholds.collector_error_for,
            severity="warning",
            summary="A warden collector keeps failing; its metrics are missing.",
            description=(
                "Collector {{ $labels.collector }} on {{ $labels.instance }} raises "
                '{{ printf "%.2f" $value }} errors per second; the series it exports are '
                "missing, and alerts built on them are blind."
            ),
            dashboard=DASHBOARD_FAULTS,
        ),
    ),
)

# --- Liveness -----------------------------------------------------------------------------
LIVENESS = RuleGroup(
    "warden-liveness",
    (
        AlertRule(
            name="WardenEngineStalled",
            expr=lambda c: f"max {c.by()} ({c.select(ENGINE_STALLED)}) == 1",
            for_=lambda c: c.thresholds.engine_stalled_for,
            severity="critical",
            summary="The engine has work but makes no progress.",
            description=(
                "The engine on {{ $labels.instance }} has requests running or waiting and "
                "completed no step within the stall timeout (stalled = {{ $value }})."
            ),
            dashboard=DASHBOARD_OVERVIEW,
        ),
        AlertRule(
            name="WardenEngineDown",
            expr=lambda c: (
                f"(\n  max {c.by()} ({c.select('up')})\n  or absent({c.select('up')}) * 0\n) == 0"
            ),
            for_=lambda c: c.thresholds.engine_down_for,
            severity="critical",
            summary="Prometheus cannot scrape the engine.",
            description=lambda c: (
                "Scrapes of engine target {{ $labels.instance }} fail (up = {{ $value }}); "
                f"an empty instance means no target matches {{{c.engine_selector}}} at all."
            ),
            dashboard=DASHBOARD_OVERVIEW,
        ),
        AlertRule(
            name="WardenRestartLoop",
            expr=lambda c: f"round({rec.RESTARTS_1H}) > {c.thresholds.restarts_per_hour}",
            for_=lambda c: c.thresholds.restart_loop_for,
            severity="critical",
            summary="The supervisor keeps restarting the engine.",
            description=(
                'The engine on {{ $labels.instance }} restarted {{ printf "%.0f" $value }} '
                "times in the last hour."
            ),
            dashboard=DASHBOARD_OVERVIEW,
        ),
        AlertRule(
            name="WardenEngineUnhealthy",
            expr=lambda c: f"min {c.by()} ({c.select(ENGINE_HEALTHY)}) == 0",
            for_=lambda c: c.thresholds.engine_unhealthy_for,
            severity="critical",
            summary="vLLM reports the engine unhealthy.",
            description=lambda c: (
                "vLLM on {{ $labels.instance }} has failed its health check for "
                f"{spoken(c.thresholds.engine_unhealthy_for)} (healthy = {{{{ $value }}}})."
            ),
            dashboard=DASHBOARD_OVERVIEW,
        ),
    ),
)

ALERT_GROUPS: tuple[RuleGroup, ...] = (
    MEMORY,
    CREEP,
    TRAFFIC,
    FAULTS,
    LIVENESS,
    fleet.FLEET,
    fleet.DELIVERY,
)
ALERT_RULES: tuple[AlertRule, ...] = tuple(
    rule for group in ALERT_GROUPS for rule in group.rules if isinstance(rule, AlertRule)
)
ALERT_NAMES: tuple[str, ...] = tuple(dict.fromkeys(rule.name for rule in ALERT_RULES))
