"""Whether an alert is about this engine: the identity check of the webhook path.

In a fleet, a notification can reach the wrong engine (a load balancer in front of the webhook,
a relay misconfigured, a replayed payload). An engine applies an alert only when the alert's
identity labels name it:

- ``instance`` must be present and be one of this engine's names. An alert without
  ``instance`` is about the fleet, not about one engine (a rule that aggregated the instance
  away): no engine acts on it; it pages people (docs/fleets.md, "Fleet-wide alerts").
- every other identity label this engine knows (``namespace``, ``cluster``) must be equal when
  the alert carries it too: same-named pods in two namespaces are two engines.

Pure logic: the engine side (warden/engine/identity.py) decides which names are this engine's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

INSTANCE = "instance"


@dataclass(frozen=True)
class EngineIdentity:
    """This engine as the alerts name it: its ``instance`` names and other identity labels."""

    instances: frozenset[str]
    labels: Mapping[str, str] = field(default_factory=dict)

    def refusal(self, alert_labels: Mapping[str, str]) -> str | None:
        """None when the alert is about this engine, else why not (for the log)."""
        instance = alert_labels.get(INSTANCE)
        if not instance:
            return "no instance label: a fleet-wide alert, applied by no engine"
        if instance not in self.instances:
            return f"instance {instance!r} is not this engine ({', '.join(sorted(self.instances))})"
        for label, mine in self.labels.items():
            theirs = alert_labels.get(label)
            if theirs is not None and theirs != mine:
                return f"{label} {theirs!r} is not this engine's {mine!r}"
        return None

    def accepts(self, alert_labels: Mapping[str, str]) -> bool:
        return self.refusal(alert_labels) is None

    def to_json(self) -> dict[str, object]:
        return {"instances": sorted(self.instances), "labels": dict(self.labels)}
