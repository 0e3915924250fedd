"""Faults: non-finite logits, retries and collector errors.

Expected labels and descriptions are spelled out by hand, so they check the rules instead of
echoing them.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.catalog import (
    COLLECTOR_ERRORS,
    NONFINITE_LOGITS,
    REQUEST_RETRIES,
    REQUEST_RETRIES_EXHAUSTED,
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
