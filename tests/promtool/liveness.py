"""Liveness: stalled, down, restarting and unhealthy engines.

Expected labels and descriptions are spelled out by hand, so they check the rules instead of
echoing them.
"""

from __future__ import annotations

from alerts.config import ENGINE_JOB
from exporter.catalog import (
    ENGINE_HEALTHY,
    ENGINE_RESTARTS,
    ENGINE_STALLED,
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
    INSTANCE,
    TARGET,
    counter,
    labels,
    s,
)

CRITICAL = labels("critical")


def stalled_desc() -> str:
    return (
        f"The engine on {INSTANCE} has requests running or waiting and completed no step "
        "within the stall timeout (stalled = 1)."
    )


def down_desc(instance: str) -> str:
    return (
        f"Scrapes of engine target {instance} fail (up = 0); an empty instance means no "
        f'target matches {{job="{ENGINE_JOB}"}} at all.'
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
