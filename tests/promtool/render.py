"""Rendering scenarios into ``promtool test rules`` files.

Expected labels and descriptions are written out by hand in the scenario modules, not derived
from the rules, so a changed threshold, label or template fails a test. The static annotations
(summary, runbook_url, dashboard_url) are taken from the rule, whose lookup by name, severity
and action labels must match exactly one rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from alerts.model import AlertRule
from alerts.rules import ALERT_RULES
from alerts.rules_file import RULE_GROUPS
from alerts.yamltext import dump_yaml
from tests.promtool.model import (
    Expected,
    RecordingScenario,
    Scenario,
    TestFile,
    series_text,
)

# Recording rules first: promtool's default order is arbitrary, which would make a recorded
# value lag by one evaluation in some runs and not in others.
GROUP_ORDER = tuple(group.name for group in RULE_GROUPS)


def find_rule(alertname: str, labels: Mapping[str, str]) -> AlertRule:
    """The one rule that produced an alert with these labels: of the rules whose static labels
    the alert carries, the one with the most (a rule's ``horizon`` label tells it apart)."""
    matches = [
        rule
        for rule in ALERT_RULES
        if rule.name == alertname
        and all(labels.get(key) == value for key, value in rule.labels.items())
    ]
    most = max((len(rule.labels) for rule in matches), default=0)
    matches = [rule for rule in matches if len(rule.labels) == most]
    if len(matches) != 1:
        raise LookupError(f"{len(matches)} rules match {alertname} {dict(labels)}")
    return matches[0]


def _exp_alert(alertname: str, expected: Expected) -> dict[str, Any]:
    rule = find_rule(alertname, expected.labels)
    annotations = rule.annotations()
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
Rendered from tests/promtool/ by tests/test_alerts_promtool.py, next to a rendered rules.yml."""


def render_test_file(
    test_file: TestFile, rule_file: str = "rules.yml", group_order: Sequence[str] = GROUP_ORDER
) -> str:
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
