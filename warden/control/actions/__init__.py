"""The one registry of degradation actions: one module per action, registered here.

An action arrives as an alert's ``warden_action`` label (parameters as other labels, strings),
as a manual override (parameters as JSON, ``warden degrade set``), or from the local reflex.
``parse_action`` validates it against the registry before any state changes;
``warden.control.policy.combine`` folds the live leases into one effective policy with each
action's ``merge`` (always the most restrictive); the controller publishes each action's
``gauge`` as ``warden_degradation_active{action}``; ``warden.control.admission`` asks each
action, in registry order, whether it ``refuses`` a request and what ``cap`` it puts on it;
``warden generate`` writes docs/actions.md from it.

To add an action: write one module beside these (``ACTION = Action(...)``, see base.py) and
add it to ``REGISTRY`` below (its place is the order refusals are checked in). Built-in names
are also the label values of ``exporter.catalog.DEGRADATION_ACTIONS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter import catalog
from warden.control.actions import (
    cap_max_tokens,
    circuit_breaker,
    enforce_eager,
    reject_all,
    shed_low_priority,
    stop_admission,
)
from warden.control.actions.base import (
    MAX_LEASE_TTL_S,
    MAX_PREEMPT,
    MAX_RETRY_AFTER_S,
    PREEMPT,
    RETRY_AFTER,
    Action,
    ActionError,
    ActionRequest,
    Param,
    Refusal,
)
from warden.control.actions.registry import LiveActions, LiveNames, Registry

__all__ = [
    "ACTIONS",
    "MAX_LEASE_TTL_S",
    "MAX_PREEMPT",
    "MAX_RETRY_AFTER_S",
    "PREEMPT",
    "REFLEX_ACTIONS",
    "REGISTRY",
    "RETRY_AFTER",
    "Action",
    "ActionError",
    "ActionRequest",
    "Param",
    "Refusal",
    "parse_action",
]

# Registry order is the order refusals are checked in: the widest refusal names the reason.
REGISTRY = Registry(
    circuit_breaker.ACTION,
    reject_all.ACTION,
    stop_admission.ACTION,
    shed_low_priority.ACTION,
    cap_max_tokens.ACTION,
    enforce_eager.ACTION,
)
ACTIONS: Mapping[str, Action] = LiveActions(REGISTRY)
REFLEX_ACTIONS = LiveNames(REGISTRY, reflex_only=True)
if set(REGISTRY.names()) != set(catalog.DEGRADATION_ACTIONS):  # pragma: no cover - import check
    raise RuntimeError("warden.control.actions and catalog.DEGRADATION_ACTIONS disagree")


def parse_action(action: Any, params: Mapping[str, Any]) -> ActionRequest:
    """Validate ``action`` and pick its parameters out of ``params`` (labels or JSON)."""
    spec = REGISTRY.by_name.get(action) if isinstance(action, str) else None
    if spec is None:
        raise ActionError(f"unknown action {action!r}")
    out: dict[str, Any] = {}
    for param in (*spec.params, *spec.extra_params):
        raw = params.get(param.label, params.get(param.name))  # alert label, or JSON name
        if raw is None and param.required:
            raise ActionError(f"{spec.name} needs {param.label}")
        value = param.default if raw is None else param.parse(param.label, raw)
        if value is not None:
            out[param.name] = value
    preempt = params.get(PREEMPT.label, params.get(PREEMPT.name))
    count = 0 if preempt in (None, "", "0", 0) else int(PREEMPT.parse(PREEMPT.label, preempt))
    return ActionRequest(spec.name, out, count)
