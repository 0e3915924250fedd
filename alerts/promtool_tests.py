"""Promtool unit tests written as data: scenarios of input series and what must happen.

Each ``Scenario`` feeds series to the generated rules and states, at chosen times, that an alert
fires (every label and annotation of every firing alert spelled out), is still pending inside
its ``for``, stays quiet on healthy input, or has resolved. Rendering turns them into
``promtool test rules`` files under alerts/generated/tests/, committed next to the rules.

Expected labels and descriptions are written out by hand in alerts/scenarios.py, not derived
from the rules, so a changed threshold, label or template fails a test. The static annotations
(summary, runbook_url, dashboard_url) are taken from the rule, whose lookup by name, severity
and action labels must match exactly one rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from alerts.model import AlertRule
from alerts.rules import ALERT_RULES
from alerts.yamltext import dump_yaml
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


def find_rule(alertname: str, labels: Mapping[str, str]) -> AlertRule:
    """The one rule that produced an alert with these labels."""
    matches = [
        rule
        for rule in ALERT_RULES
        if rule.name == alertname
        and all(labels.get(key) == value for key, value in rule.labels.items())
    ]
    if len(matches) != 1:
        raise LookupError(f"{len(matches)} rules match {alertname} {dict(labels)}")
    return matches[0]


def _exp_alert(alertname: str, expected: Expected) -> dict[str, Any]:
    rule = find_rule(alertname, expected.labels)
    annotations = dict(rule.annotations)
    annotations["description"] = expected.description
    return {"exp_labels": dict(sorted(expected.labels.items())), "exp_annotations": annotations}


def _alerts_selector(alertname: str, state: str | None = None) -> str:
    labels = {"alertname": alertname}
    if state is not None:
        labels["alertstate"] = state
    return series_text("ALERTS", labels)


def _render_scenario(scenario: Scenario) -> dict[str, Any]:
    alert_tests: list[dict[str, Any]] = []
    expr_tests: list[dict[str, Any]] = []
    for alertname, check in scenario.checks_for():
        alert_tests.append(
            {
                "eval_time": check.at,
                "alertname": alertname,
                "exp_alerts": [_exp_alert(alertname, e) for e in check.firing],
            }
        )
        if check.kind == "pending":
            samples = [
                {
                    "labels": series_text(
                        "ALERTS", {**labels, "alertname": alertname, "alertstate": "pending"}
                    ),
                    "value": 1,
                }
                for labels in check.pending
            ]
            expr_tests.append(
                {
                    "expr": _alerts_selector(alertname, "pending"),
                    "eval_time": check.at,
                    "exp_samples": samples,
                }
            )
        elif check.kind in ("healthy", "resolved"):
            # Not firing (exp_alerts above) and not pending either.
            expr_tests.append(
                {"expr": _alerts_selector(alertname), "eval_time": check.at, "exp_samples": []}
            )
    test: dict[str, Any] = {
        "name": f"{scenario.alertname}: {scenario.title}",
        "interval": scenario.interval,
        "input_series": [{"series": s, "values": v} for s, v in scenario.series.items()],
        "alert_rule_test": alert_tests,
    }
    if expr_tests:
        test["promql_expr_test"] = expr_tests
    return test


def _render_recording(scenario: RecordingScenario) -> dict[str, Any]:
    return {
        "name": f"recording rules: {scenario.title}",
        "interval": scenario.interval,
        "input_series": [{"series": s, "values": v} for s, v in scenario.series.items()],
        "promql_expr_test": [
            {
                "expr": check.expr,
                "eval_time": check.at,
                "exp_samples": [{"labels": s.labels, "value": s.value} for s in check.samples],
            }
            for check in scenario.checks
        ],
    }


HEADER = """\
Generated by `warden generate` from alerts/scenarios.py: do not edit.
Run: promtool test rules alerts/generated/tests/*.yml"""


def render_test_file(test_file: TestFile, rule_file: str, group_order: Sequence[str]) -> str:
    """Text of one promtool test file; ``rule_file`` is relative to the test file's folder.

    ``group_order`` pins the order groups are evaluated in at each step (recording rules first);
    promtool's default order is arbitrary, which would make a recorded value lag by one
    evaluation in some runs and not in others.
    """
    tests = [
        _render_recording(s) if isinstance(s, RecordingScenario) else _render_scenario(s)
        for s in test_file.scenarios
    ]
    document = {
        "rule_files": [rule_file],
        "evaluation_interval": test_file.evaluation_interval,
        "group_eval_order": list(group_order),
        "tests": tests,
    }
    return dump_yaml(document, HEADER)
