"""The two rule shapes warden generates: recording rules and alerting rules.

Small frozen dataclasses that validate the label contract the engine webhook relies on
(``exporter.catalog.ACTION_LABEL`` and the ``PARAM_*`` labels) when they are built, so a typo
fails at import time instead of silently never degrading anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from alerts.config import DEFAULT, SEVERITIES, MixinConfig, Severity, Templated, render
from alerts.durations import DURATION, duration_s
from exporter.catalog import ACTION_LABEL, ACTION_PARAM_LABELS, DEGRADATION_ACTIONS, MetricSpec

__all__ = ["AlertRule", "RecordingRule", "RuleGroup", "duration_s", "recorded_name"]

_RECORD_NAME = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")
_ALERT_NAME = re.compile(r"^Warden[A-Z][A-Za-z0-9]*$")


def recorded_name(level: str, metric: MetricSpec | str, operations: str) -> str:
    """``level:metric:operations``; ``_total`` stripped and vLLM's colons made underscores."""
    base = metric.base if isinstance(metric, MetricSpec) else metric
    return f"{level}:{base.replace(':', '_')}:{operations}"


@dataclass(frozen=True)
class RecordingRule:
    """A precomputed series, named ``level:metric:operations``; ``expr`` may depend on the
    mixin config (a function of it)."""

    record: str
    expr: Templated

    def __post_init__(self) -> None:
        if not _RECORD_NAME.match(self.record):
            raise ValueError(f"recording rule name {self.record!r} is not level:metric:operations")

    def render_expr(self, config: MixinConfig = DEFAULT) -> str:
        return render(self.expr, config)

    def to_rule(self, config: MixinConfig = DEFAULT) -> dict[str, Any]:
        return {"record": self.record, "expr": self.render_expr(config)}


@dataclass(frozen=True)
class AlertRule:
    """One alerting rule; several rules may share a name and differ by severity or action.

    ``action`` and ``params`` become the ``warden_action`` / ``warden_*`` labels the engine
    webhook turns into a degradation lease. ``description`` is a Go template and must mention
    ``$labels.instance`` and ``$value``. ``expr`` and ``description`` may depend on the mixin
    config (functions of it): selectors and aggregations always do.

    ``scope="fleet"``: the alert is about a whole job (no ``instance``: its description names
    ``$labels.job``). Fleet-wide alerts page people and never carry an action: an engine applies
    only alerts that name it (docs/fleets.md).
    """

    name: str
    expr: Templated
    severity: Severity
    summary: str
    description: Templated
    dashboard: str
    for_: Templated
    keep_firing_for: Templated | None = None
    action: str | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    scope: Literal["engine", "fleet"] = "engine"
    # Static labels that tell apart rules of one name and severity (WardenTimeToOOM's horizon).
    extra_labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _ALERT_NAME.match(self.name):
            raise ValueError(f"alert name {self.name!r} must be CamelCase with the Warden prefix")
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.name}: unknown severity {self.severity!r}")
        for duration in (self.render_for(DEFAULT), self.render_keep_firing_for(DEFAULT)):
            if duration is not None and not DURATION.match(duration):
                raise ValueError(f"{self.name}: bad duration {duration!r}")
        if self.action is not None and self.action not in DEGRADATION_ACTIONS:
            raise ValueError(f"{self.name}: unknown action {self.action!r}")
        if self.params and self.action is None:
            raise ValueError(f"{self.name}: action parameters without an action")
        if self.scope == "fleet" and self.action is not None:
            raise ValueError(f"{self.name}: a fleet-wide alert cannot carry an engine action")
        for label, value in self.params.items():
            if label not in ACTION_PARAM_LABELS:
                raise ValueError(f"{self.name}: {label!r} is not an action parameter label")
            if not isinstance(value, str):
                raise ValueError(f"{self.name}: label {label} must be a string")
        description = self.render_description(DEFAULT)
        subject = "$labels.job" if self.scope == "fleet" else "$labels.instance"
        for placeholder in (subject, "$value"):
            if placeholder not in description:
                raise ValueError(f"{self.name}: description lacks {placeholder}")
        DEFAULT.dashboard_url(self.dashboard)  # raises on an unknown uid

    def render_expr(self, config: MixinConfig = DEFAULT) -> str:
        return render(self.expr, config)

    def render_description(self, config: MixinConfig = DEFAULT) -> str:
        return render(self.description, config)

    def render_for(self, config: MixinConfig = DEFAULT) -> str:
        return render(self.for_, config)

    def render_keep_firing_for(self, config: MixinConfig = DEFAULT) -> str | None:
        keep = self.keep_firing_for
        return None if keep is None else render(keep, config)

    @property
    def labels(self) -> dict[str, str]:
        """Static labels the rule adds to every alert it fires."""
        labels: dict[str, str] = {"severity": self.severity}
        if self.action is not None:
            labels[ACTION_LABEL] = self.action
        labels.update(sorted(self.params.items()))
        labels.update(sorted(self.extra_labels.items()))
        return labels

    def annotations(self, config: MixinConfig = DEFAULT) -> dict[str, str]:
        return {
            "summary": self.summary,
            "description": self.render_description(config),
            "runbook_url": config.runbook_url(self.name),
            "dashboard_url": config.dashboard_url(self.dashboard),
        }

    def with_holds_at_most(self, cap_s: int) -> AlertRule:
        """This rule with ``for`` and ``keep_firing_for`` cut to ``cap_s`` seconds at most: a
        demo's timings. The expression, labels and annotations stay as they are."""

        def capped(hold: Templated) -> Templated:
            def at_most(config: MixinConfig) -> str:
                value = render(hold, config)
                return f"{cap_s}s" if duration_s(value) > cap_s else value

            return at_most

        keep = self.keep_firing_for
        return replace(
            self, for_=capped(self.for_), keep_firing_for=None if keep is None else capped(keep)
        )

    def to_rule(self, config: MixinConfig = DEFAULT) -> dict[str, Any]:
        rule: dict[str, Any] = {
            "alert": self.name,
            "expr": self.render_expr(config),
            "for": self.render_for(config),
        }
        keep = self.render_keep_firing_for(config)
        if keep is not None:
            rule["keep_firing_for"] = keep
        rule["labels"] = self.labels
        rule["annotations"] = self.annotations(config)
        return rule


@dataclass(frozen=True)
class RuleGroup:
    """A Prometheus rule group: rules evaluated in order at one interval."""

    name: str
    rules: tuple[RecordingRule | AlertRule, ...]

    def to_group(self, config: MixinConfig = DEFAULT) -> dict[str, Any]:
        return {"name": self.name, "rules": [rule.to_rule(config) for rule in self.rules]}
