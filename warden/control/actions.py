"""The one registry of degradation actions: each action's parameters, how two leases of it
merge, the value it publishes, and what it does to a request, defined together.

An action arrives as an alert's ``warden_action`` label (parameters as other labels, strings),
as a manual override (parameters as JSON), or from the local reflex. ``parse_action`` validates
it against the registry before any state changes. ``warden.control.policy.combine`` folds the
live leases into one effective policy with each action's ``merge`` (always the most
restrictive); the controller publishes ``gauge`` as ``warden_degradation_active{action}``;
``warden.control.admission.decide`` asks each action, in registry order, whether it ``refuses``
a request and what ``cap`` it puts on it. The names are the catalog's label values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exporter import catalog

if TYPE_CHECKING:
    from warden.control.policy import EffectivePolicy

CIRCUIT_MODES = ("half_open", "open")
# warden_circuit_breaker_state / warden_degradation_active{action="circuit_breaker"} values.
CIRCUIT_ORDER = {mode: index for index, mode in enumerate(catalog.CIRCUIT_STATES)}
# Hard bounds: no alert label, override or config value goes past them. A client told to come
# back in a day, or an override forgotten for a week, is an outage of its own making.
MAX_RETRY_AFTER_S = 600
MAX_LEASE_TTL_S = 3600
MAX_PREEMPT = 64


class ActionError(ValueError):
    """An action or one of its parameters is invalid; the message says which."""


# --- parameters -----------------------------------------------------------------------------


def _int(low: int, high: int) -> Callable[[str, Any], int]:
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


def _fraction(name: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise ActionError(f"{name}={raw!r}: not a number")
    try:
        value = float(str(raw).strip()[:32])
    except (TypeError, ValueError):
        raise ActionError(f"{name}={raw!r}: not a number") from None
    if not 0.0 < value <= 1.0:
        raise ActionError(f"{name}={value}: must be in (0, 1]")
    return value


def _circuit(name: str, raw: Any) -> str:
    if raw not in CIRCUIT_MODES:
        raise ActionError(f"{name}={raw!r}: use half_open or open")
    return str(raw)


@dataclass(frozen=True)
class Param:
    """One parameter: its name in JSON and in the policy, its alert label, and its parser."""

    name: str
    label: str
    parse: Callable[[str, Any], Any]
    required: bool = False
    default: Any = None


MAX_TOKENS = Param("max_tokens", catalog.PARAM_MAX_TOKENS, _int(1, 10_000_000), required=True)
PRIORITY_THRESHOLD = Param(
    "priority_threshold", catalog.PARAM_PRIORITY_THRESHOLD, _int(-(2**31), 2**31)
)
RETRY_AFTER = Param("retry_after", catalog.PARAM_RETRY_AFTER, _int(1, MAX_RETRY_AFTER_S))
CIRCUIT = Param("circuit", catalog.PARAM_CIRCUIT, _circuit, default="open")
ADMIT_FRACTION = Param("admit_fraction", catalog.PARAM_ADMIT_FRACTION, _fraction)
# A one-shot extra any action may carry: preempt this many of the largest requests on apply.
PREEMPT = Param("preempt", catalog.PARAM_PREEMPT, _int(0, MAX_PREEMPT))


# --- what an action does ----------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """An action refusing a request: the HTTP status, the reason label, a message."""

    status: int
    reason: str
    message: str


Fields = dict[str, Any]  # the effective policy's fields while leases are folded in
Merge = Callable[[Fields, Mapping[str, Any], "PolicyDefaults"], None]
Refuse = Callable[["EffectivePolicy", int, Callable[[float], bool]], Refusal | None]


@dataclass(frozen=True)
class PolicyDefaults:
    """Values an action falls back to when its lease does not say (the control config's)."""

    retry_after_s: int = 5
    shed_priority_threshold: int = 0
    half_open_admit_fraction: float = 0.5


@dataclass(frozen=True)
class Action:
    """One degradation action, everything about it in one place.

    ``merge`` folds one lease's params into the policy fields (most restrictive wins);
    ``gauge`` is its ``warden_degradation_active`` value (0 = off); ``refuse`` decides a
    request's fate given its priority and the half-open gate (None = not refused by this
    action); ``refuse_last`` is asked after every action's ``refuse`` passed; ``cap`` is the
    max_tokens limit it imposes (None = none); ``reflex`` says whether the local reflex may
    take it; ``extra_params`` are the shared ones it accepts besides its own.
    """

    name: str
    summary: str
    params: tuple[Param, ...]
    merge: Merge
    gauge: Callable[[EffectivePolicy], float]
    refuse: Refuse | None = None
    refuse_last: Refuse | None = None
    cap: Callable[[EffectivePolicy], int | None] | None = None
    reflex: bool = False
    extra_params: tuple[Param, ...] = field(default=(RETRY_AFTER,))


def _set(name: str) -> Merge:
    def merge(fields: Fields, _params: Mapping[str, Any], _defaults: PolicyDefaults) -> None:
        fields[name] = True

    return merge


def _merge_cap(fields: Fields, params: Mapping[str, Any], _defaults: PolicyDefaults) -> None:
    value = int(params["max_tokens"])
    current = fields["cap_max_tokens"]
    fields["cap_max_tokens"] = value if current is None else min(current, value)


def _merge_shed(fields: Fields, params: Mapping[str, Any], defaults: PolicyDefaults) -> None:
    value = int(params.get("priority_threshold", defaults.shed_priority_threshold))
    current = fields["shed_priority_above"]
    fields["shed_priority_above"] = value if current is None else min(current, value)


def _merge_circuit(fields: Fields, params: Mapping[str, Any], defaults: PolicyDefaults) -> None:
    mode = params.get("circuit", "open")
    if CIRCUIT_ORDER[mode] > CIRCUIT_ORDER[fields["circuit"]]:
        fields["circuit"] = mode
    if mode == "half_open":
        fraction = float(params.get("admit_fraction", defaults.half_open_admit_fraction))
        fields["admit_fraction"] = min(fields["admit_fraction"], fraction)


def _refuse_open_circuit(
    policy: EffectivePolicy, _priority: int, gate: Callable[[float], bool]
) -> Refusal | None:
    if policy.circuit == "open":
        return Refusal(503, "circuit_open", "circuit breaker open: engine error rate too high")
    return None


def _refuse_half_open(
    policy: EffectivePolicy, _priority: int, gate: Callable[[float], bool]
) -> Refusal | None:
    # Asked last among the refusals: the gate's credit is spent only on requests that every
    # other action would let through.
    if policy.circuit == "half_open" and not gate(policy.admit_fraction):
        return Refusal(
            503, "circuit_half_open", "circuit breaker half-open: request not let through"
        )
    return None


def _refuse_if(flag: str, reason: str, message: str) -> Refuse:
    def refuse(
        policy: EffectivePolicy, _priority: int, _gate: Callable[[float], bool]
    ) -> Refusal | None:
        return Refusal(503, reason, message) if getattr(policy, flag) else None

    return refuse


def _refuse_low_priority(
    policy: EffectivePolicy, priority: int, _gate: Callable[[float], bool]
) -> Refusal | None:
    threshold = policy.shed_priority_above
    if threshold is not None and priority > threshold:
        return Refusal(
            503,
            "shed_low_priority",
            f"low-priority requests (priority > {threshold}) are being shed",
        )
    return None


# Registry order is the order refusals are checked in: the widest refusal names the reason.
REGISTRY: tuple[Action, ...] = (
    Action(
        "circuit_breaker",
        "refuse all (open) or admit a fraction (half_open) while errors are high",
        (CIRCUIT, ADMIT_FRACTION),
        _merge_circuit,
        gauge=lambda p: float(CIRCUIT_ORDER[p.circuit]),
        refuse=_refuse_open_circuit,
        refuse_last=_refuse_half_open,
    ),
    Action(
        "reject_all",
        "refuse every new request with 503 + Retry-After",
        (),
        _set("reject_all"),
        gauge=lambda p: float(p.reject_all),
        refuse=_refuse_if("reject_all", "reject_all", "server is rejecting all new requests"),
        reflex=True,
    ),
    Action(
        "stop_admission",
        "admit nothing new; requests in flight finish",
        (),
        _set("stop_admission"),
        gauge=lambda p: float(p.stop_admission),
        refuse=_refuse_if(
            "stop_admission", "stop_admission", "server is not admitting new requests"
        ),
        reflex=True,
    ),
    Action(
        "shed_low_priority",
        "refuse requests whose priority number is above the threshold (larger = less important)",
        (PRIORITY_THRESHOLD,),
        _merge_shed,
        gauge=lambda p: float(p.shed_priority_above is not None),
        refuse=_refuse_low_priority,
        reflex=True,
        extra_params=(),
    ),
    Action(
        "cap_max_tokens",
        "lower every request's output token limit to the cap",
        (MAX_TOKENS,),
        _merge_cap,
        gauge=lambda p: float(p.cap_max_tokens or 0),
        cap=lambda p: p.cap_max_tokens,
        reflex=True,
        extra_params=(),
    ),
    Action(
        "enforce_eager",
        "the supervisor drains and restarts vLLM with --enforce-eager (CUDA graphs off)",
        (),
        _set("enforce_eager"),
        gauge=lambda p: float(p.enforce_eager),
        extra_params=(),
    ),
)
ACTIONS: dict[str, Action] = {action.name: action for action in REGISTRY}
# How much each action protects the engine, least first: when a source's leases are full, a
# protective action (the last two) evicts the least protective lease rather than be dropped.
PROTECTION: tuple[str, ...] = (
    "enforce_eager",
    "cap_max_tokens",
    "shed_low_priority",
    "circuit_breaker",
    "stop_admission",
    "reject_all",
)
PROTECTIVE: frozenset[str] = frozenset({"stop_admission", "reject_all"})
if set(PROTECTION) != set(ACTIONS):  # pragma: no cover - import-time check
    raise RuntimeError("warden.control.actions: PROTECTION must rank every action")
REFLEX_ACTIONS: tuple[str, ...] = tuple(a.name for a in REGISTRY if a.reflex)
if set(ACTIONS) != set(catalog.DEGRADATION_ACTIONS):  # pragma: no cover - import-time check
    raise RuntimeError("warden.control.actions and catalog.DEGRADATION_ACTIONS disagree")


# --- parsing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActionRequest:
    """One action with validated parameters; ``preempt`` is a one-shot extra, not a lease."""

    action: str
    params: dict[str, Any] = field(default_factory=dict)
    preempt: int = 0


def parse_action(action: Any, params: Mapping[str, Any]) -> ActionRequest:
    """Validate ``action`` and pick its parameters out of ``params`` (labels or JSON)."""
    spec = ACTIONS.get(action) if isinstance(action, str) else None
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
