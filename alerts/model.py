"""The two rule shapes warden generates: recording rules and alerting rules.

Small frozen dataclasses that validate the label contract the engine webhook relies on
(``exporter.catalog.ACTION_LABEL`` and the ``PARAM_*`` labels) when they are built, so a typo
fails at import time instead of silently never degrading anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from alerts.config import SEVERITIES, Severity, dashboard_url, runbook_url
from exporter.catalog import ACTION_LABEL, ACTION_PARAM_LABELS, DEGRADATION_ACTIONS, MetricSpec

_RECORD_NAME = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")
_ALERT_NAME = re.compile(r"^Warden[A-Z][A-Za-z0-9]*$")
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def recorded_name(level: str, metric: MetricSpec | str, operations: str) -> str:
    """``level:metric:operations``; ``_total`` stripped and vLLM's colons made underscores."""
    base = metric.base if isinstance(metric, MetricSpec) else metric
    return f"{level}:{base.replace(':', '_')}:{operations}"


@dataclass(frozen=True)
class RecordingRule:
    """A precomputed series, named ``level:metric:operations``."""

    record: str
    expr: str

    def __post_init__(self) -> None:
        if not _RECORD_NAME.match(self.record):
            raise ValueError(f"recording rule name {self.record!r} is not level:metric:operations")

    def to_rule(self) -> dict[str, Any]:
        return {"record": self.record, "expr": self.expr}


@dataclass(frozen=True)
class AlertRule:
    """One alerting rule; several rules may share a name and differ by severity or action.

    ``action`` and ``params`` become the ``warden_action`` / ``warden_*`` labels the engine
    webhook turns into a degradation lease. ``description`` is a Go template and must mention
    ``$labels.instance`` and ``$value``.
    """

    name: str
    expr: str
    severity: Severity
    summary: str
    description: str
    dashboard: str
    for_: str
    keep_firing_for: str | None = None
    action: str | None = None
    params: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _ALERT_NAME.match(self.name):
            raise ValueError(f"alert name {self.name!r} must be CamelCase with the Warden prefix")
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.name}: unknown severity {self.severity!r}")
        for duration in (self.for_, self.keep_firing_for):
            if duration is not None and not _DURATION.match(duration):
                raise ValueError(f"{self.name}: bad duration {duration!r}")
        if self.action is not None and self.action not in DEGRADATION_ACTIONS:
            raise ValueError(f"{self.name}: unknown action {self.action!r}")
        if self.params and self.action is None:
            raise ValueError(f"{self.name}: action parameters without an action")
        for label, value in self.params.items():
            if label not in ACTION_PARAM_LABELS:
                raise ValueError(f"{self.name}: {label!r} is not an action parameter label")
            if not isinstance(value, str):
                raise ValueError(f"{self.name}: label {label} must be a string")
        for placeholder in ("$labels.instance", "$value"):
            if placeholder not in self.description:
                raise ValueError(f"{self.name}: description lacks {placeholder}")
        dashboard_url(self.dashboard)  # raises on an unknown uid

    @property
    def labels(self) -> dict[str, str]:
        """Static labels the rule adds to every alert it fires."""
        labels: dict[str, str] = {"severity": self.severity}
        if self.action is not None:
            labels[ACTION_LABEL] = self.action
        labels.update(sorted(self.params.items()))
        return labels

    @property
    def annotations(self) -> dict[str, str]:
        return {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": runbook_url(self.name),
            "dashboard_url": dashboard_url(self.dashboard),
        }

    def to_rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr, "for": self.for_}
        if self.keep_firing_for is not None:
            rule["keep_firing_for"] = self.keep_firing_for
        rule["labels"] = self.labels
        rule["annotations"] = self.annotations
        return rule


@dataclass(frozen=True)
class RuleGroup:
    """A Prometheus rule group: rules evaluated in order at one interval."""

    name: str
    rules: tuple[RecordingRule | AlertRule, ...]

    def to_group(self) -> dict[str, Any]:
        return {"name": self.name, "rules": [rule.to_rule() for rule in self.rules]}
