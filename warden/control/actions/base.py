"""What a degradation action is: its parameters, the policy fields it owns, how two leases of
it merge, the value it publishes, and what it does to a request.

An action sees only its own fields of the effective policy (a mapping), never the policy class
or the lease table: that keeps this module at the bottom of ``warden.control``. The registry
(``warden.control.actions``) lists the actions; ``warden.control.policy`` folds leases with
them; ``warden.control.admission`` asks them about each request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter import catalog

# Hard bounds: no alert label, override or config value goes past them. A client told to come
# back in a day, or an override forgotten for a week, is an outage of its own making.
MAX_RETRY_AFTER_S = 600
MAX_LEASE_TTL_S = 3600
MAX_PREEMPT = 64


class ActionError(ValueError):
    """An action or one of its parameters is invalid; the message says which."""


# --- parameters -----------------------------------------------------------------------------


def integer(low: int, high: int) -> Callable[[str, Any], int]:
    """A parser for a bounded integer (from a label string or JSON)."""

    def parse(name: str, raw: Any) -> int:
        if isinstance(raw, bool):
            raise ActionError(f"{name}={raw!r}: not an integer")
        text = str(raw).strip()
        if len(text) > 20:  # no int() on a 10,000-digit string
            raise ActionError(f"{name}: integer too long")
        try:
            value = int(text)
        except (TypeError, ValueError):
            raise ActionError(f"{name}={raw!r}: not an integer") from None
        if not low <= value <= high:
            raise ActionError(f"{name}={value}: must be in {low}..{high}")
        return value

    return parse


def fraction(name: str, raw: Any) -> float:
    """A parser for a fraction in (0, 1]."""
    if isinstance(raw, bool):
        raise ActionError(f"{name}={raw!r}: not a number")
    try:
        value = float(str(raw).strip()[:32])
    except (TypeError, ValueError):
        raise ActionError(f"{name}={raw!r}: not a number") from None
    if not 0.0 < value <= 1.0:
        raise ActionError(f"{name}={value}: must be in (0, 1]")
    return value


@dataclass(frozen=True)
class Param:
    """One parameter: its name in JSON and in the policy, its alert label, and its parser.

    ``default`` is filled in when the request does not say (it is then part of the lease);
    ``fallback`` is what the policy uses when a lease does not carry the parameter, and
    ``setting`` names the ``admission`` config field that overrides it (whose own default is
    ``fallback``: the one place that number is written).
    """

    name: str
    label: str
    parse: Callable[[str, Any], Any]
    required: bool = False
    default: Any = None
    fallback: Any = None
    setting: str | None = None
    doc: str = ""


# Shared parameters any action may carry (see ``Action.extra_params``).
DEFAULT_RETRY_AFTER_S = 5
RETRY_AFTER = Param(
    "retry_after",
    catalog.PARAM_RETRY_AFTER,
    integer(1, MAX_RETRY_AFTER_S),
    fallback=DEFAULT_RETRY_AFTER_S,
    setting="retry_after_s",
    doc="Retry-After seconds for refused requests (the longest of the leases wins)",
)
# A one-shot extra: preempt this many of the largest requests when the lease is applied.
PREEMPT = Param(
    "preempt",
    catalog.PARAM_PREEMPT,
    integer(0, MAX_PREEMPT),
    doc="also preempt this many requests holding the most KV, once",
)


# --- what an action does ----------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """An action refusing a request: the HTTP status, the reason label, a message."""

    status: int
    reason: str
    message: str


Fields = dict[str, Any]  # the effective policy's fields while leases are folded in
View = Mapping[str, Any]  # the effective policy's fields, read-only
Defaults = Mapping[str, Any]  # parameter name -> the value a lease that does not say gets
Gate = Callable[[float], bool]  # the half-open gate: admit this fraction of requests
Merge = Callable[[Fields, Mapping[str, Any], Defaults], None]
Refuse = Callable[[View, int, Gate], Refusal | None]


@dataclass(frozen=True)
class Action:
    """One degradation action, everything about it in one place.

    ``fields`` are the effective policy's fields it owns, at their values while it is off;
    ``merge`` folds one lease's params into them (most restrictive wins); ``settle`` tidies
    them once every lease is folded; ``gauge`` is its ``warden_degradation_active`` value
    (0 = off); ``refuse`` decides a request's fate from its priority and the half-open gate
    (None = not refused by this action), ``refuse_last`` is asked after every action's
    ``refuse`` passed; ``cap`` is the max_tokens limit it imposes (None = none); ``reflex``
    says whether the local reflex may take it; ``protection`` ranks it when a source's leases
    are full (higher: more protective) and a ``protective`` one evicts the least protective
    lease rather than be dropped; ``extra_params`` are the shared ones it accepts besides its
    own; ``summary`` is its line in the docs.
    """

    name: str
    summary: str
    fields: Mapping[str, Any]
    merge: Merge
    gauge: Callable[[View], float]
    params: tuple[Param, ...] = ()
    settle: Callable[[Fields], None] | None = None
    refuse: Refuse | None = None
    refuse_last: Refuse | None = None
    cap: Callable[[View], int | None] | None = None
    reflex: bool = False
    protection: int = 0
    protective: bool = False
    extra_params: tuple[Param, ...] = field(default=(RETRY_AFTER,))


def switch_on(name: str) -> Merge:
    """The merge of an action that is simply on while held: its one boolean field."""

    def merge(fields: Fields, _params: Mapping[str, Any], _defaults: Defaults) -> None:
        fields[name] = True

    return merge


def refuse_if(flag: str, reason: str, message: str) -> Refuse:
    """A refusal of every request (503) while the boolean field ``flag`` is set."""

    def refuse(fields: View, _priority: int, _gate: Gate) -> Refusal | None:
        return Refusal(503, reason, message) if fields[flag] else None

    return refuse


def param(params: Mapping[str, Any], defaults: Defaults, spec: Param) -> Any:
    """The lease's value of ``spec``, or the configured fallback when it does not say."""
    return params.get(spec.name, defaults.get(spec.name, spec.fallback))


@dataclass(frozen=True)
class ActionRequest:
    """One action with validated parameters; ``preempt`` is a one-shot extra, not a lease."""

    action: str
    params: dict[str, Any] = field(default_factory=dict)
    preempt: int = 0
