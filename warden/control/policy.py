"""The effective policy: the most restrictive combination of the live leases.

Each action's merge rule lives in the registry (``warden.control.actions``); this module only
holds the result and folds leases into it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

from warden.control.actions import ACTIONS, CIRCUIT_ORDER, PolicyDefaults
from warden.control.leases import Lease

__all__ = ["CIRCUIT_ORDER", "EffectivePolicy", "active_actions", "combine", "gauge_values"]


@dataclass(frozen=True)
class EffectivePolicy:
    stop_admission: bool = False
    reject_all: bool = False
    cap_max_tokens: int | None = None
    shed_priority_above: int | None = None
    circuit: str = "closed"
    admit_fraction: float = 1.0
    enforce_eager: bool = False
    retry_after_s: int = 5

    @property
    def degraded(self) -> bool:
        return bool(self.active_actions())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def active_actions(self) -> list[str]:
        """The degradation actions in force, by name (empty when not degraded)."""
        return active_actions(self)


def gauge_values(policy: EffectivePolicy) -> dict[str, float]:
    """``warden_degradation_active{action}`` for every action (0 = not in force)."""
    return {name: action.gauge(policy) for name, action in ACTIONS.items()}


def active_actions(policy: EffectivePolicy) -> list[str]:
    return [name for name, value in gauge_values(policy).items() if value]


def combine(
    leases: Iterable[Lease],
    default_retry_after_s: int = 5,
    default_shed_threshold: int = 0,
    default_admit_fraction: float = 0.5,
) -> EffectivePolicy:
    defaults = PolicyDefaults(default_retry_after_s, default_shed_threshold, default_admit_fraction)
    folded: dict[str, Any] = {f.name: f.default for f in fields(EffectivePolicy)}
    folded["retry_after_s"] = default_retry_after_s
    for lease in leases:
        action = ACTIONS.get(lease.action)
        if action is None:  # a lease from a newer registry: nothing to enforce here
            continue
        if "retry_after" in lease.params:
            folded["retry_after_s"] = max(folded["retry_after_s"], int(lease.params["retry_after"]))
        action.merge(folded, lease.params, defaults)
    if folded["circuit"] != "half_open":
        folded["admit_fraction"] = 0.0 if folded["circuit"] == "open" else 1.0
    return EffectivePolicy(**folded)
