"""Traffic: saturation, queue wait, preemption storms, the error-ratio circuit, and six hours of
steady saturation that must alert nobody.

Expected labels and descriptions are spelled out by hand, so they check the rules instead of
echoing them.
"""

from __future__ import annotations

from collections.abc import Callable

from alerts.rules import ALERT_NAMES
from exporter.catalog import (
    ACTION_LABEL,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    MEMORY_RISK,
    MEMORY_WATERMARK,
    MEMORY_WATERMARK_PEAK,
    PARAM_ADMIT_FRACTION,
    PARAM_CIRCUIT,
    PARAM_PRIORITY_THRESHOLD,
    SATURATED,
    TORCH_ALLOCATED,
    TORCH_DEVICE_TOTAL,
    TORCH_RESERVED,
    VLLM_KV_CACHE_USAGE,
    VLLM_NUM_PREEMPTIONS,
    VLLM_NUM_REQUESTS_RUNNING,
    VLLM_NUM_REQUESTS_WAITING,
    VLLM_QUEUE_TIME,
    VLLM_REQUEST_SUCCESS,
)
from tests.promtool.model import (
    Expected,
    Scenario,
    fires,
    healthy,
    pending,
    resolved,
    values_text,
)
from tests.promtool.series import (
    GIB,
    INSTANCE,
    counter,
    engine_up,
    labels,
    per_minute,
    requests,
    s,
    wobble,
)

SATURATED_WARNING = labels(
    "warning", **{ACTION_LABEL: "shed_low_priority", PARAM_PRIORITY_THRESHOLD: "0"}
)
SATURATED_CRITICAL = labels(
    "critical", **{ACTION_LABEL: "shed_low_priority", PARAM_PRIORITY_THRESHOLD: "0"}
)
_SATURATED_DESC = (
    f"{INSTANCE} is saturated: a new request would miss its latency SLO or queue limit, so "
    "warden refuses it with a Retry-After computed from the drain rate"
)


def saturated(value: str = "1") -> Expected:
    return Expected(
        SATURATED_WARNING,
        f"{_SATURATED_DESC} (saturated = {value}); low-priority requests are shed.",
    )


def overloaded(percent: str) -> Expected:
    return Expected(
        SATURATED_CRITICAL,
        f"{_SATURATED_DESC} ({percent} of requests refused over 5 minutes); low-priority "
        "requests are shed.",
    )


def flags(*steps: tuple[int, int]) -> str:
    """A 0/1 gauge per minute from (value, minutes) steps."""
    return values_text(float(value) for value, minutes in steps for _ in range(minutes))


# warden_saturated (held 20 s by the engine) from 10m to 30m, scraped every minute.
SATURATED_20M = {s(SATURATED): flags((0, 10), (1, 20), (0, 30))}
# An overload hovering on the SLO: refusing for one minute, admitting for the next two, for 40
# minutes. The alert must fire once and hold, not follow every swing.
SATURATED_SWINGING = {s(SATURATED): flags((0, 10), *[(1, 1), (0, 2)] * 13, (0, 31))}
# 3x overload: 60 completions a minute, 120 refused (2 in 3) from 10m to 40m.
OVERLOAD = {
    s(SATURATED): flags((0, 10), (1, 30), (0, 20)),
    **requests(
        60,
        success=lambda m: 60,
        rejected=per_minute((0, 10), (120, 30)),
    ),
}

SATURATION_SCENARIOS = (
    Scenario(
        "WardenSaturated",
        "admission refuses for saturation for 20 minutes",
        SATURATED_20M,
        (
            healthy("9m"),
            pending("10m", SATURATED_WARNING),
            fires("11m", saturated()),
            fires("29m", saturated()),
            # cleared at 30m: the 1m window, then keep_firing_for 2m
            fires("32m", saturated()),
            resolved("34m"),
            resolved("59m"),
        ),
    ),
    Scenario(
        "WardenSaturated",
        "an overload swinging in and out of saturation fires once and holds",
        SATURATED_SWINGING,
        (
            healthy("9m"),
            pending("10m", SATURATED_WARNING),
            # every check from 11m to 49m: firing, never pending again, never resolved
            *(fires(f"{minute}m", saturated()) for minute in range(11, 50)),
            resolved("52m"),
            resolved("79m"),
        ),
    ),
    Scenario(
        "WardenSaturated",
        "3x overload: two requests in three refused for 30 minutes",
        OVERLOAD,
        (
            healthy("9m"),
            # 360 refused of 660 over 5 minutes at 12m: over half, inside its for
            pending("13m", SATURATED_CRITICAL, also_firing=[saturated()]),
            # 2 refused a second (120 a minute) of 3: the refused share over 5 minutes
            fires("20m", overloaded("66.67%"), saturated()),
            fires("39m", overloaded("66.67%"), saturated()),
            # refusals stopped at 40m; both hold for keep_firing_for, critical showing its value
            # of 40m, the last evaluation it held: 480 refused of 780 over 5 minutes
            fires("42m", overloaded("61.54%"), saturated()),
            resolved("44m"),
            resolved("59m"),
        ),
    ),
)

QUEUE_WAIT = labels("warning")
QUEUE_BUCKETS = ("1", "10", "60", "120", "300", "+Inf")


def queue_time(bad: Callable[[int], bool], minutes: int) -> dict[str, str]:
    """vLLM's queue-time histogram, 60 requests a minute: all wait under a second, except in
    ``bad`` minutes, when half of them wait between 2 and 5 minutes."""
    out = {}
    for le in QUEUE_BUCKETS:
        slow = le in ("300", "+Inf")
        out[s(f"{VLLM_QUEUE_TIME.name}_bucket", le=le)] = values_text(
            counter(lambda m, slow=slow: 60 if slow or not bad(m) else 30, minutes)
        )
    return out


def queue_wait_desc(seconds: str) -> str:
    return (
        f"90% of requests on {INSTANCE} waited up to {seconds} s in the queue over 5 minutes; "
        "set a latency SLO (admission.saturation) to refuse what would miss it instead."
    )


QUEUE_WAIT_SCENARIOS = (
    Scenario(
        "WardenQueueWaitHigh",
        "half the requests wait minutes in the queue for 40 minutes",
        queue_time(lambda m: 10 <= m < 50, 70),
        (
            healthy("10m"),
            pending("11m", QUEUE_WAIT),
            # p90 within (120, 300]: 120 + 180 * (54 - 30) / 30
            fires("26m", Expected(QUEUE_WAIT, queue_wait_desc("264"))),
            fires("49m", Expected(QUEUE_WAIT, queue_wait_desc("264"))),
            resolved("53m"),
        ),
    ),
)

PREEMPTION_STORM = labels("warning")


def finished(per_minute_count: float, minutes: int) -> dict[str, str]:
    return {
        s(VLLM_REQUEST_SUCCESS, finished_reason="length"): values_text(
            counter(lambda m: per_minute_count, minutes)
        )
    }


# 60 requests finish a minute; 90 preemptions a minute from minute 10 to 40 (1.5 per finished).
PREEMPTIONS_BURST = {
    s(VLLM_NUM_PREEMPTIONS): values_text(counter(per_minute((0, 10), (90, 30)), 60)),
    **finished(60, 60),
}


def preemption_desc(per_finished: str) -> str:
    return (
        f"vLLM on {INSTANCE} preempts {per_finished} requests per finished request; their work "
        "is recomputed, so throughput collapses."
    )


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
        "1.5 preemptions per finished request for 30 minutes",
        PREEMPTIONS_BURST,
        (
            # the 5-minute rate passes one per finished request at 13m
            healthy("12m"),
            pending("13m", PREEMPTION_STORM),
            pending("27m", PREEMPTION_STORM),
            fires("28m", Expected(PREEMPTION_STORM, preemption_desc("1.50"))),
            fires("40m", Expected(PREEMPTION_STORM, preemption_desc("1.20"))),
            resolved("41m"),
        ),
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


# Six hours of an engine at full load, as vLLM runs it (H200, 140.54 GiB, default 0.92): the
# batch is full and the KV cache at 97-100%, 20 requests queue for a few seconds, a preemption
# now and then (4 per 60 finished), every request admitted (no SLO is missed, so
# warden_saturated stays 0), memory exactly where vLLM planned it (device and allocator risk 0,
# the allocator's live tensors churning inside the reserved pool). Not one alert may fire or
# even go pending, at any evaluation.
STEADY_MINUTES = 6 * 60
H200_TOTAL = round(140.54 * GIB)
H200_PLANNED = round(0.92 * 140.54 * GIB)


def _wobbled(level: float, amplitude: float, period: int = 7) -> list[float]:
    return [round(level + wobble(m, amplitude, period), 4) for m in range(STEADY_MINUTES)]


STEADY_SATURATION = {
    **engine_up(STEADY_MINUTES),
    s(VLLM_KV_CACHE_USAGE): values_text(_wobbled(0.985, 0.015)),
    s(VLLM_NUM_REQUESTS_RUNNING): f"256x{STEADY_MINUTES - 1}",
    s(VLLM_NUM_REQUESTS_WAITING): values_text(_wobbled(20, 12, 5)),
    s(VLLM_NUM_PREEMPTIONS): values_text(counter(lambda m: 4, STEADY_MINUTES)),
    **finished(60, STEADY_MINUTES),
    **queue_time(lambda m: False, STEADY_MINUTES),
    **requests(STEADY_MINUTES, success=lambda m: 60),
    s(SATURATED): f"0x{STEADY_MINUTES - 1}",
    s(MEMORY_WATERMARK): f"0x{STEADY_MINUTES - 1}",
    s(MEMORY_WATERMARK_PEAK): f"0x{STEADY_MINUTES - 1}",
    s(MEMORY_RISK, source="device"): f"0x{STEADY_MINUTES - 1}",
    s(MEMORY_RISK, source="allocator"): f"0x{STEADY_MINUTES - 1}",
    s(GPU_MEMORY_USED, gpu="0"): values_text(
        [H200_PLANNED - round(wobble(m, GIB / 4)) - GIB // 4 for m in range(STEADY_MINUTES)]
    ),
    s(GPU_MEMORY_TOTAL, gpu="0"): f"{H200_TOTAL}x{STEADY_MINUTES - 1}",
    s(TORCH_RESERVED, device="cuda:0"): f"{H200_PLANNED - 2 * GIB}x{STEADY_MINUTES - 1}",
    s(TORCH_ALLOCATED, device="cuda:0"): values_text(
        [H200_PLANNED - 4 * GIB + round(wobble(m, GIB, 5)) for m in range(STEADY_MINUTES)]
    ),
    s(TORCH_DEVICE_TOTAL, device="cuda:0"): f"{H200_TOTAL}x{STEADY_MINUTES - 1}",
}

STEADY_SCENARIOS = (
    Scenario(
        "WardenSaturated",
        "six hours of steady saturation: no alert, nothing pending",
        STEADY_SATURATION,
        tuple(
            healthy(f"{minute}m", alertname=name)
            for minute in range(0, STEADY_MINUTES, 10)
            for name in sorted(ALERT_NAMES)
        ),
    ),
)
