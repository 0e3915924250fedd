"""Traffic: the queue backlog bands, preemption storms and the error-ratio circuit.

Expected labels and descriptions are spelled out by hand, so they check the rules instead of
echoing them.
"""

from __future__ import annotations

from exporter.catalog import (
    ACTION_LABEL,
    PARAM_ADMIT_FRACTION,
    PARAM_CIRCUIT,
    PARAM_MAX_TOKENS,
    PARAM_PRIORITY_THRESHOLD,
    PARAM_RETRY_AFTER,
    VLLM_NUM_PREEMPTIONS,
    VLLM_NUM_REQUESTS_WAITING,
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
    INSTANCE,
    counter,
    labels,
    per_minute,
    requests,
    s,
)

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
