"""Input series for the promtool scenarios: the engine target, counters, memory that creeps.

Series are built from the catalog's MetricSpecs, never retyped names; creep alerts run on hours
of one-minute samples with a small wobble, the way memory really moves.
"""

from __future__ import annotations

from collections.abc import Callable

from alerts.config import ENGINE_JOB
from exporter.catalog import REQUESTS, MetricSpec
from tests.promtool.model import series_text, values_text

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


def per_minute(*steps: tuple[float, int]) -> Callable[[int], float]:
    """A counter's increase each minute from (increase, minutes) steps; zero afterwards."""
    schedule = [rate for rate, minutes in steps for _ in range(minutes)]
    return lambda minute: schedule[minute] if minute < len(schedule) else 0.0


def requests(minutes: int, **outcomes: Callable[[int], float]) -> dict[str, str]:
    """warden_requests_total by outcome, from per-minute increases."""
    return {
        s(REQUESTS, outcome=name): values_text(counter(increase, minutes))
        for name, increase in outcomes.items()
    }
