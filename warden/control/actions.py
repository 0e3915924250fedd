"""Degradation actions and their parameters, validated from strings (alert labels, JSON).

Parameters arrive as alert labels (strings) or JSON values; each action knows which it takes
and their ranges, so a bad value is refused before any state changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exporter import catalog

ACTIONS = frozenset(catalog.DEGRADATION_ACTIONS)
CIRCUIT_MODES = ("half_open", "open")


class ActionError(ValueError):
    """An action or one of its parameters is invalid; the message says which."""


def _int(name: str, raw: Any, low: int, high: int) -> int:
    try:
        value = int(str(raw).strip())
    except (TypeError, ValueError):
        raise ActionError(f"{name}={raw!r}: not an integer") from None
    if not low <= value <= high:
        raise ActionError(f"{name}={value}: must be in {low}..{high}")
    return value


def _fraction(name: str, raw: Any) -> float:
    try:
        value = float(str(raw).strip())
    except (TypeError, ValueError):
        raise ActionError(f"{name}={raw!r}: not a number") from None
    if not 0.0 < value <= 1.0:
        raise ActionError(f"{name}={value}: must be in (0, 1]")
    return value


@dataclass(frozen=True)
class ActionRequest:
    """One action with validated parameters; ``preempt`` is a one-shot extra, not a lease."""

    action: str
    params: dict[str, Any] = field(default_factory=dict)
    preempt: int = 0


def parse_action(action: Any, params: dict[str, Any]) -> ActionRequest:
    """Validate ``action`` and pick its parameters out of ``params`` (labels or JSON)."""
    if not isinstance(action, str) or action not in ACTIONS:
        raise ActionError(f"unknown action {action!r}")
    out: dict[str, Any] = {}
    if action == "cap_max_tokens":
        raw = params.get(catalog.PARAM_MAX_TOKENS, params.get("max_tokens"))
        if raw is None:
            raise ActionError(f"cap_max_tokens needs {catalog.PARAM_MAX_TOKENS}")
        out["max_tokens"] = _int(catalog.PARAM_MAX_TOKENS, raw, 1, 10_000_000)
    elif action == "shed_low_priority":
        raw = params.get(catalog.PARAM_PRIORITY_THRESHOLD, params.get("priority_threshold"))
        if raw is not None:
            out["priority_threshold"] = _int(catalog.PARAM_PRIORITY_THRESHOLD, raw, -(2**31), 2**31)
    elif action == "circuit_breaker":
        mode = params.get(catalog.PARAM_CIRCUIT, params.get("circuit", "open"))
        if mode not in CIRCUIT_MODES:
            raise ActionError(f"{catalog.PARAM_CIRCUIT}={mode!r}: use half_open or open")
        out["circuit"] = mode
        raw = params.get(catalog.PARAM_ADMIT_FRACTION, params.get("admit_fraction"))
        if raw is not None:
            out["admit_fraction"] = _fraction(catalog.PARAM_ADMIT_FRACTION, raw)
    raw_retry = params.get(catalog.PARAM_RETRY_AFTER, params.get("retry_after"))
    if raw_retry is not None and action in ("reject_all", "stop_admission", "circuit_breaker"):
        out["retry_after"] = _int(catalog.PARAM_RETRY_AFTER, raw_retry, 1, 86400)
    raw_preempt = params.get(catalog.PARAM_PREEMPT, params.get("preempt"))
    preempt = (
        0 if raw_preempt in (None, "", "0") else _int(catalog.PARAM_PREEMPT, raw_preempt, 0, 64)
    )
    return ActionRequest(action, out, preempt)
