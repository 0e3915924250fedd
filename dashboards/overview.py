"""Overview: is the engine serving well, and is warden protecting it right now?

The top row answers at a glance (pressure level, active degradation, alerts, KV fill, load,
errors); below, the same signals over time with latency and throughput.
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from dashboards.layout import Row, warden_dashboard
from dashboards.panels import (
    BAD,
    OK,
    WARN,
    WORST,
    PromTarget,
    gauge,
    stat,
    state_timeline,
    steps,
    target,
    timeseries,
    value_names,
)
from dashboards.queries import aggregate, increase, label_value, quantile, rate, selector
from exporter.catalog import (
    ADMISSION_REJECTIONS,
    ADMITTED_SLO,
    DEGRADATION_ACTIVE,
    DEGRADATION_LEASES,
    DRAIN_RATE,
    LATENCY_SLO,
    MAX_TOKENS_CAPPED,
    MEMORY_WATERMARK,
    QUEUE_WAIT_PREDICTED,
    REFLEX_ACTIONS,
    REQUEST_OUTCOMES,
    REQUESTS,
    SATURATED,
    SATURATION_TRANSITIONS,
    SERVICE_TIME,
    SLO_OUTCOMES,
    VLLM_ADMISSION_REJECTIONS,
    VLLM_E2E_LATENCY,
    VLLM_GENERATION_TOKENS,
    VLLM_INTER_TOKEN_LATENCY,
    VLLM_KV_CACHE_USAGE,
    VLLM_NUM_REQUESTS_RUNNING,
    VLLM_NUM_REQUESTS_WAITING,
    VLLM_PROMPT_TOKENS,
    VLLM_QUEUE_TIME,
    VLLM_TTFT,
    WATERMARK_LEVELS,
    MetricSpec,
)

UID = "warden-overview"
TITLE = "vLLM Warden / Overview"

# Requests per second: the unit of every request-rate panel.
REQUESTS_PER_SECOND = "reqps"
# Grafana has no token unit; "short" scales thousands and the title says tokens per second.
TOKENS_PER_SECOND = "short"

KV_STEPS = steps((OK, None), (WARN, 0.8), (BAD, 0.95))
WATERMARK_NAMES = value_names(WATERMARK_LEVELS, (OK, WARN, BAD, WORST))
ACTIVE_NAMES = value_names(("off", "active"), (OK, WARN))
FIRING = 'ALERTS{alertstate="firing"}'


def server_error_ratio() -> str:
    """Share of requests that failed on the server side (client errors and rejections aside)."""
    failed = rate(REQUESTS, outcome=label_value(REQUEST_OUTCOMES, "server_error"))
    return f"{failed} / clamp_min({rate(REQUESTS)}, 1e-9)"


def headline_row() -> Row:
    watermark = stat(
        "Memory watermark",
        "Worst memory pressure level across the selected engines. Normal: 'normal' (green). "
        "'high' and above mean warden is throttling or shedding to avoid an OOM.",
        [target(aggregate("max", selector(MEMORY_WATERMARK)))],
        MEMORY_WATERMARK.unit,
        mappings=WATERMARK_NAMES,
        sparkline=False,
    )
    degradation = stat(
        "Degradation actions active",
        "How many degradation actions (admission stop, token cap, shedding...) are in force. "
        "Normal: 0.",
        [target(f"count({selector(DEGRADATION_ACTIVE)} > 0) or vector(0)")],
        DEGRADATION_ACTIVE.unit,
        thresholds=steps((OK, None), (WARN, 1)),
    )
    alerts = stat(
        "Firing alerts",
        "Alerts firing in this Prometheus (any job). Normal: 0.",
        [target(f"count({FIRING}) or vector(0)")],
        "none",
        thresholds=steps((OK, None), (WARN, 1), (BAD, 3)),
    )
    kv = gauge(
        "KV cache usage",
        "Fullest KV cache among the selected engines. Under load 50-80% is healthy; near 100% "
        "the scheduler preempts requests.",
        [target(aggregate("max", selector(VLLM_KV_CACHE_USAGE)))],
        VLLM_KV_CACHE_USAGE.unit,
        minimum=0,
        maximum=1,
        thresholds=KV_STEPS,
    )
    running = stat(
        "Requests running",
        "Requests in the running batch right now, all selected engines.",
        [target(aggregate("sum", selector(VLLM_NUM_REQUESTS_RUNNING)))],
        VLLM_NUM_REQUESTS_RUNNING.unit,
    )
    errors = stat(
        "Server error ratio",
        "Share of requests that ended in a server error over the last few scrapes. "
        "Normal: 0%; client errors and load-shedding rejections are not counted here.",
        [target(server_error_ratio())],
        "percentunit",
        thresholds=steps((OK, None), (WARN, 0.01), (BAD, 0.05)),
    )
    return Row(
        4, [(4, watermark), (4, degradation), (4, alerts), (4, kv), (4, running), (4, errors)]
    )


def protection_row() -> Row:
    watermark = state_timeline(
        "Memory watermark level",
        "Pressure level per engine over time. Normal: a solid green 'normal' band.",
        [target(aggregate("max", selector(MEMORY_WATERMARK), ["instance"]), "{{instance}}")],
        MEMORY_WATERMARK.unit,
        mappings=WATERMARK_NAMES,
    )
    actions = state_timeline(
        "Degradation actions",
        "When each degradation action was in force (markers show every change). "
        "Normal: every action 'off'.",
        [
            target(
                aggregate("max", f"{selector(DEGRADATION_ACTIVE)} > bool 0", ["action"]),
                "{{action}}",
            )
        ],
        "none",
        mappings=ACTIVE_NAMES,
    )
    leases = timeseries(
        "Degradation leases by holder",
        "Live leases on degradation actions by who took them: alertmanager, the in-engine "
        "reflex, or an operator (manual). Normal: 0.",
        [target(aggregate("sum", selector(DEGRADATION_LEASES), ["source"]), "{{source}}")],
        DEGRADATION_LEASES.unit,
        stacked=True,
    )
    return Row(7, [(8, watermark), (10, actions), (6, leases)])


def load_row() -> Row:
    kv = timeseries(
        "KV cache usage",
        "KV cache fill per engine. Climbing to 100% under steady load means requests will be "
        "preempted; warden's watermark reacts before that.",
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
    queue = timeseries(
        "Running and waiting requests",
        "Batch size and queue length. Normal: waiting near 0; a growing queue means the "
        "engine cannot keep up or admission is being held.",
        [
            target(
                aggregate("sum", selector(VLLM_NUM_REQUESTS_RUNNING), ["model_name"]),
                "running {{model_name}}",
            ),
            target(
                aggregate("sum", selector(VLLM_NUM_REQUESTS_WAITING), ["model_name"]),
                "waiting {{model_name}}",
            ),
        ],
        VLLM_NUM_REQUESTS_RUNNING.unit,
    )
    rejections = timeseries(
        "Admission rejections",
        "Requests refused, by warden's admission control and by vLLM's own queue limits. "
        "Normal: 0; non-zero while a degradation action or queue limit is shedding load.",
        [
            target(rate(ADMISSION_REJECTIONS, ["reason"]), "warden {{reason}}"),
            target(rate(VLLM_ADMISSION_REJECTIONS), "vLLM queue limits"),
        ],
        REQUESTS_PER_SECOND,
    )
    return Row(8, [(8, kv), (8, queue), (8, rejections)])


def saturation_row() -> Row:
    """Admission at saturation: a full engine is no risk; a request that would miss the SLO is."""
    saturated = state_timeline(
        "Saturation (admission refuses)",
        "1 while a typical new request would miss the latency SLO or a queue limit, so "
        "admission refuses with a Retry-After from the drain rate (held 20 s). Normal: 0, "
        "including at full load with the KV cache near 100%.",
        [target(aggregate("max", selector(SATURATED), ["instance"]), "{{instance}}")],
        SATURATED.unit,
        mappings=ACTIVE_NAMES,
    )
    wait = timeseries(
        "Predicted latency against the SLO",
        "What admission predicts for a new request: queue wait (from the queue and the measured "
        "drain rate) and service time (p99 of recent requests, scaled to the batch it will be "
        "served in), next to the SLO it protects "
        "(0 = none set). Normal: wait + service below the SLO.",
        [
            target(aggregate("max", selector(QUEUE_WAIT_PREDICTED), ["instance"]), "wait"),
            target(aggregate("max", selector(SERVICE_TIME), ["instance"]), "service p99"),
            target(aggregate("max", selector(LATENCY_SLO), ["instance"]), "SLO"),
        ],
        QUEUE_WAIT_PREDICTED.unit,
    )
    drain = timeseries(
        "Drain rate and saturation changes",
        "Requests the engine finishes per second (what Retry-After is computed from), and "
        "changes of the saturation state. Normal: changes rare, never several a minute.",
        [
            target(aggregate("max", selector(DRAIN_RATE), ["instance"]), "drain {{instance}}"),
            target(increase(SATURATION_TRANSITIONS, ["to"]), "to {{to}}"),
        ],
        DRAIN_RATE.unit,
    )
    within, _missed = SLO_OUTCOMES
    kept = timeseries(
        "Admitted requests within the SLO",
        "The share of requests admitted under a latency SLO that were answered within it, "
        "timed from admission to the last byte. Normal: 1 (no data while no SLO is set); "
        "below 0.99 admission admits more than the engine serves in time.",
        [
            target(
                f"{rate(ADMITTED_SLO, ['instance'], outcome=within)} / "
                f"{rate(ADMITTED_SLO, ['instance'])}",
                "{{instance}}",
            )
        ],
        "percentunit",
    )
    return Row(7, [(5, saturated), (7, wait), (6, drain), (6, kept)])


def percentiles(short_name: str, spec: MetricSpec) -> list[PromTarget]:
    """Median and p99 of a latency histogram, as two lines."""
    return [
        target(quantile(0.5, spec), f"p50 {short_name}"),
        target(quantile(0.99, spec), f"p99 {short_name}"),
    ]


def latency_row() -> Row:
    ttft = timeseries(
        "Time to first token",
        "Median and 99th percentile of the wait until a request's first token. Should stay "
        "flat under steady load; a rising p99 with a flat p50 points at queueing or preemption.",
        percentiles("TTFT", VLLM_TTFT),
        VLLM_TTFT.unit,
    )
    itl = timeseries(
        "Inter-token latency",
        "Median and 99th percentile of the time between two output tokens of a request. "
        "Normal: steady; it grows with batch size.",
        percentiles("ITL", VLLM_INTER_TOKEN_LATENCY),
        VLLM_INTER_TOKEN_LATENCY.unit,
    )
    tokens = timeseries(
        "Tokens per second",
        "Prompt tokens processed (prefill) and tokens generated (decode) per second. Follows "
        "the offered load; a drop while requests wait means the engine is stuck or throttled.",
        [
            target(rate(VLLM_PROMPT_TOKENS), "prompt"),
            target(rate(VLLM_GENERATION_TOKENS), "generated"),
        ],
        TOKENS_PER_SECOND,
    )
    waits = timeseries(
        "Queue time and end-to-end latency",
        "p99 time requests waited in the queue, and p50/p99 of the whole request. Normal: queue "
        "time a small share of end-to-end; when it dominates, the engine is saturated.",
        [
            target(quantile(0.99, VLLM_QUEUE_TIME), "p99 queue"),
            *percentiles("end-to-end", VLLM_E2E_LATENCY),
        ],
        VLLM_E2E_LATENCY.unit,
    )
    return Row(8, [(6, ttft), (6, itl), (6, waits), (6, tokens)])


def outcome_row() -> Row:
    outcomes = timeseries(
        "Requests by outcome",
        "Requests per second seen by warden, stacked by outcome. Normal: nearly all "
        "'success'; 'rejected' is load shedding, 'server_error' needs a look.",
        [target(rate(REQUESTS, ["outcome"]), "{{outcome}}")],
        REQUESTS_PER_SECOND,
        stacked=True,
    )
    interventions = timeseries(
        "Warden interventions (5 min)",
        "Leases the in-engine reflex took, by action, and requests whose max_tokens warden "
        "lowered. Normal: 0; they rise with the watermark and fall back after it.",
        [
            target(increase(REFLEX_ACTIONS, ["action"]), "reflex {{action}}"),
            target(increase(MAX_TOKENS_CAPPED), "max_tokens capped"),
        ],
        REFLEX_ACTIONS.unit,
        bars=True,
    )
    alerts = state_timeline(
        "Firing alerts",
        "Each firing alert as a band, by name and severity. Normal: no bands.",
        [
            target(
                aggregate("max", FIRING, ["alertname", "severity"]),
                "{{alertname}} ({{severity}})",
            )
        ],
        "none",
        thresholds=steps((BAD, None)),
    )
    return Row(8, [(9, outcomes), (7, interventions), (8, alerts)])


def dashboard() -> Dashboard:
    return warden_dashboard(
        UID,
        TITLE,
        "Serving health and warden's protection at a glance: memory pressure, degradation, "
        "alerts, load, latency and errors.",
        [
            headline_row(),
            protection_row(),
            saturation_row(),
            load_row(),
            latency_row(),
            outcome_row(),
        ],
    )
