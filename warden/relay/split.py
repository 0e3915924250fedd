"""Which engine each alert of a notification is about, and the notification each engine gets.

Pure: the directory lookups are done before, by the caller. An alert without ``instance`` is
fleet-wide and goes to no engine (the same rule as the engine's own check,
warden/control/identity.py); an alert whose identity no engine has is dropped as unresolved
(the engine was scaled away; its alerts resolve on their own); one that several engines match
is dropped as ambiguous (identity labels are missing: a configuration error to fix).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter import catalog
from warden.control.identity import INSTANCE

FORWARDED, FLEET_WIDE, UNRESOLVED, AMBIGUOUS, INVALID = catalog.RELAY_ALERT_OUTCOMES


@dataclass(frozen=True)
class Engine:
    """One engine as the directory knows it: its target labels and its webhook URL."""

    labels: Mapping[str, str]
    webhook_url: str


@dataclass
class Plan:
    """What to do with one notification: per-engine alert lists, and counts by outcome."""

    by_engine: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def matching_engines(
    alert_labels: Mapping[str, str], engines: Sequence[Engine], identity_labels: Sequence[str]
) -> list[Engine]:
    """Engines whose identity labels agree with the alert's (a label missing on either side,
    such as a ``cluster`` external label the targets do not carry, is not compared; ``instance``
    always is)."""
    instance = alert_labels.get(INSTANCE)
    found = []
    for engine in engines:
        if engine.labels.get(INSTANCE) != instance:
            continue
        if all(
            alert_labels.get(label) is None
            or engine.labels.get(label) is None
            or alert_labels[label] == engine.labels[label]
            for label in identity_labels
        ):
            found.append(engine)
    return found


def plan(
    alerts: Sequence[dict[str, Any]],
    engines_for: Mapping[int, Sequence[Engine]],
) -> Plan:
    """Group ``alerts`` by engine; ``engines_for[i]`` are the engines alert ``i`` matched."""
    result = Plan()
    for index, alert in enumerate(alerts):
        if not alert.get("labels", {}).get(INSTANCE):
            result.count(FLEET_WIDE)
            continue
        engines = engines_for.get(index, ())
        if not engines:
            result.count(UNRESOLVED)
        elif len(engines) > 1:
            result.count(AMBIGUOUS)
        else:
            result.by_engine.setdefault(engines[0].webhook_url, []).append(alert)
            result.count(FORWARDED)
    return result


def engine_notification(envelope: Mapping[str, Any], alerts: list[dict[str, Any]]) -> bytes:
    """The v4 notification one engine gets: the envelope of the original, its own alerts."""
    common = _common_labels(alerts)
    body = {
        "version": envelope.get("version", "4"),
        "groupKey": envelope.get("groupKey", ""),
        "truncatedAlerts": 0,
        "status": "firing" if any(a.get("status") == "firing" for a in alerts) else "resolved",
        "receiver": envelope.get("receiver", ""),
        "groupLabels": envelope.get("groupLabels", {}),
        "commonLabels": common,
        "commonAnnotations": {},
        "externalURL": envelope.get("externalURL", ""),
        "alerts": alerts,
    }
    return json.dumps(body).encode()


def _common_labels(alerts: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    if not alerts:
        return {}
    first = dict(alerts[0].get("labels", {}))
    return {
        key: value
        for key, value in first.items()
        if all(a.get("labels", {}).get(key) == value for a in alerts[1:])
    }
