"""The effective policy: the most restrictive combination of the live leases, with the cause
of each action in force.

Pure: leases in, policy out. Each action's fields and merge rule live in its own module
(``warden.control.actions``); this module folds leases with them and holds the result. The
cause of an action is the cause of the oldest live lease holding it, so a refusal names it from
the policy alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from warden.control.actions import REGISTRY
from warden.control.actions.base import RETRY_AFTER
from warden.control.actions.circuit_breaker import ORDER as CIRCUIT_ORDER
from warden.control.cause import NO_CAUSE, Cause
from warden.control.leases import Lease

__all__ = ["CIRCUIT_ORDER", "EffectivePolicy", "active_actions", "combine", "gauge_values"]


class EffectivePolicy(Mapping[str, Any]):
    """Every registered action's fields (``policy.cap_max_tokens``, ``policy["circuit"]``),
    the Retry-After refusals carry, and ``causes``: action -> the cause of the lease holding
    it. Immutable; two policies are equal when their fields and Retry-After are (the causes
    say why, not what)."""

    __slots__ = ("_fields", "causes", "retry_after_s")

    _fields: dict[str, Any]
    causes: Mapping[str, Cause]
    retry_after_s: int

    def __init__(
        self,
        retry_after_s: int = RETRY_AFTER.fallback,
        causes: Mapping[str, Cause] | None = None,
        **fields: Any,
    ) -> None:
        known = REGISTRY.field_defaults()
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise TypeError(f"EffectivePolicy: no action owns the fields {unknown}")
        object.__setattr__(self, "_fields", {**known, **fields})
        object.__setattr__(self, "causes", dict(causes or {}))
        object.__setattr__(self, "retry_after_s", retry_after_s)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("EffectivePolicy is immutable")

    def __getitem__(self, name: str) -> Any:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EffectivePolicy):
            return NotImplemented
        return (self._fields, self.retry_after_s) == (other._fields, other.retry_after_s)

    def __hash__(self) -> int:
        return hash((tuple(sorted(self._fields.items())), self.retry_after_s))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._fields.items())
        return f"EffectivePolicy({fields}, retry_after_s={self.retry_after_s})"

    @property
    def degraded(self) -> bool:
        return bool(self.active_actions())

    def view(self) -> Mapping[str, Any]:
        """The fields as a plain mapping (what actions read; faster than the attributes)."""
        return self._fields

    def cause(self, action: str) -> Cause:
        """The signal and value behind the lease holding ``action`` (the oldest, if several)."""
        return self.causes.get(action, NO_CAUSE)

    def to_json(self) -> dict[str, Any]:
        return {**self._fields, "retry_after_s": self.retry_after_s}

    def active_actions(self) -> list[str]:
        """The degradation actions in force, by name (empty when not degraded)."""
        return active_actions(self)


def gauge_values(policy: EffectivePolicy) -> dict[str, float]:
    """``warden_degradation_active{action}`` for every action (0 = not in force)."""
    fields = policy.view()
    return {action.name: action.gauge(fields) for action in REGISTRY}


def active_actions(policy: EffectivePolicy) -> list[str]:
    return [name for name, value in gauge_values(policy).items() if value]


def combine(leases: Iterable[Lease], defaults: Mapping[str, Any] | None = None) -> EffectivePolicy:
    """Fold ``leases`` into one policy; ``defaults`` (parameter name -> value, see
    ``Registry.defaults``) fills in what a lease does not say."""
    defaults = REGISTRY.defaults() if defaults is None else defaults
    folded = REGISTRY.field_defaults()
    retry_after = int(defaults.get(RETRY_AFTER.name, RETRY_AFTER.fallback))
    causes: dict[str, tuple[float, Cause]] = {}
    for lease in leases:
        action = REGISTRY.by_name.get(lease.action)
        if action is None:  # a lease from a newer registry: nothing to enforce here
            continue
        if RETRY_AFTER.name in lease.params:
            retry_after = max(retry_after, int(lease.params[RETRY_AFTER.name]))
        action.merge(folded, lease.params, defaults)
        held = causes.get(action.name)
        if held is None or lease.started_at < held[0]:
            causes[action.name] = (lease.started_at, lease.cause())
    for action in REGISTRY:
        if action.settle is not None:
            action.settle(folded)
    return EffectivePolicy(retry_after, {k: v for k, (_at, v) in causes.items()}, **folded)
