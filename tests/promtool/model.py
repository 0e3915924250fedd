"""Promtool unit tests written as data: scenarios of input series and what must happen.

Each ``Scenario`` feeds series to the generated rules and states, at chosen times, that an alert
fires (every label and annotation of every firing alert spelled out), is still pending inside
its ``for``, stays quiet on healthy input, or has resolved. ``RecordingScenario`` states what
recording rules evaluate to. ``tests.promtool.render`` turns them into ``promtool test rules``
files; tests/test_alerts_promtool.py writes those next to a rendered rules.yml and runs promtool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from exporter.catalog import MetricSpec

CheckKind = Literal["fires", "pending", "healthy", "resolved"]


@dataclass(frozen=True)
class Expected:
    """A firing alert: all its labels except ``alertname``, and its rendered description."""

    labels: Mapping[str, str]
    description: str


@dataclass(frozen=True)
class Check:
    """What must hold for one alert name at ``at`` (a promtool duration from the start)."""

    at: str
    kind: CheckKind
    firing: tuple[Expected, ...] = ()
    pending: tuple[Mapping[str, str], ...] = ()
    alertname: str | None = None


def fires(at: str, *alerts: Expected, alertname: str | None = None) -> Check:
    """Exactly ``alerts`` fire for the alert name at ``at``."""
    if not alerts:
        raise ValueError("fires() needs at least one expected alert")
    return Check(at, "fires", firing=alerts, alertname=alertname)


def pending(
    at: str,
    *label_sets: Mapping[str, str],
    also_firing: Sequence[Expected] = (),
    alertname: str | None = None,
) -> Check:
    """``label_sets`` are pending (condition true, ``for`` not yet over); only ``also_firing``
    fire."""
    if not label_sets:
        raise ValueError("pending() needs at least one pending label set")
    return Check(at, "pending", firing=tuple(also_firing), pending=label_sets, alertname=alertname)


def healthy(at: str, alertname: str | None = None) -> Check:
    """Nothing fires and nothing is even pending for the alert name."""
    return Check(at, "healthy", alertname=alertname)


def resolved(at: str, alertname: str | None = None) -> Check:
    """After firing earlier in the scenario, the alert name is neither firing nor pending."""
    return Check(at, "resolved", alertname=alertname)


@dataclass(frozen=True)
class Scenario:
    """Input series for one story, and the checks along it (for ``alertname`` by default)."""

    alertname: str
    title: str
    series: Mapping[str, str]
    checks: tuple[Check, ...]
    interval: str = "1m"

    def checks_for(self) -> list[tuple[str, Check]]:
        return [(check.alertname or self.alertname, check) for check in self.checks]


@dataclass(frozen=True)
class Sample:
    """An expected sample of a PromQL expression: its full series text and value."""

    labels: str
    value: float


@dataclass(frozen=True)
class ExprCheck:
    """``expr`` evaluated at ``at`` gives exactly ``samples``."""

    at: str
    expr: str
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class RecordingScenario:
    """Input series and what recording rules (or other expressions) evaluate to."""

    title: str
    series: Mapping[str, str]
    checks: tuple[ExprCheck, ...]
    interval: str = "1m"


@dataclass(frozen=True)
class TestFile:
    """One promtool test file; its evaluation interval applies to every scenario in it."""

    name: str
    evaluation_interval: str
    scenarios: tuple[Scenario | RecordingScenario, ...] = field(default=())


def series_text(metric: MetricSpec | str, labels: Mapping[str, str]) -> str:
    """``name{a="x", b="y"}`` with labels sorted, as promtool reads series."""
    name = metric.name if isinstance(metric, MetricSpec) else metric
    inner = ", ".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def values_text(values: Iterable[float]) -> str:
    """Promtool's expanding notation for a list of samples: runs of equal steps become a+bxN."""
    points = list(values)
    parts: list[str] = []
    i = 0
    while i < len(points):
        j = i + 1
        if j < len(points):
            step = points[j] - points[i]
            while j + 1 < len(points) and points[j + 1] - points[j] == step:
                j += 1
            if j - i >= 2:
                sign = "+" if step >= 0 else "-"
                parts.append(f"{_num(points[i])}{sign}{_num(abs(step))}x{j - i}")
                i = j + 1
                continue
        parts.append(_num(points[i]))
        i += 1
    return " ".join(parts)


def _num(value: float) -> str:
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))
