"""Per-request admission: the effective policy, the KV forecast and saturation, applied to one
request.

Pure: facts in, decision out. The middleware gathers the facts (priority, max_tokens, prompt
tokens) and carries out the decision (answer 503/429/400 with the decision's error fields and
Retry-After headers, or rewrite max_tokens). It asks in two steps: ``admit`` (the policy's
refusals and saturation for a typical request, before the request's body is read, so a refused
request costs nothing) and ``limit`` (the cap, the KV forecast and saturation for this request's
prompt and output limit, which need the body); ``decide`` is both at once. Every refusal names
its cause: the ``signal`` (the memory watermark, a saturation signal, the alert or override
behind a lease) and its ``value``, so a false intervention is visible in the answer and in
``/warden/state``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.saturation import SaturationState, batch_drain_rate
from warden.control.actions import REGISTRY
from warden.control.actions.base import Refusal
from warden.control.cause import NO_CAUSE, Cause
from warden.control.config import AdmissionSettings, SaturationSettings
from warden.control.policy import EffectivePolicy
from warden.control.saturation import Breach, DeepAdmission, KvState, RetrySchedule, assess

# Before its body is read a request is judged as the shortest it could be: one token.
SHORTEST_OUTPUT = 1

__all__ = [
    "NO_CAUSE",
    "Cause",
    "Decision",
    "HalfOpenGate",
    "KvState",
    "RequestFacts",
    "Saturation",
    "admit",
    "admit_exempt",
    "decide",
    "judge_saturation",
    "limit",
    "token_ceiling",
]


@dataclass(frozen=True)
class RequestFacts:
    priority: int = 0
    max_tokens: int | None = None  # per sequence; None: up to the context length
    prompt_tokens: int | None = None
    sequences: int = 1  # n (or best_of) choices x prompts: what one request generates at once
    request_key: int | None = None  # its body's hash: the same request back is a return


@dataclass(frozen=True)
class Decision:
    admit: bool
    status: int = 200
    reason: str = ""
    message: str = ""
    retry_after_s: float = 0
    cap: int | None = None  # write this max_tokens into the request
    signal: str = ""  # what caused a refusal, and its value
    value: float | str | None = None
    # An admission into a deep slot of a full batch: what it was admitted on (the deep-slot
    # calibration compares the request's real latency with its forecast).
    deep: DeepAdmission | None = None
    # A saturation refusal: what its forecast was made of (``Breach.basis``), kept with it in
    # ``/warden/state``'s recent rejections; not sent to the client.
    basis: dict[str, float | int] | None = field(default=None, compare=False)

    def retry_after_headers(self) -> list[tuple[bytes, bytes]]:
        """``Retry-After`` in whole seconds (rounded up, at least 1) and ``retry-after-ms``,
        which the OpenAI SDK reads first; none when the client should not come back."""
        if self.retry_after_s <= 0:
            return []
        millis = round(self.retry_after_s * 1000)
        seconds = max(1, math.ceil(self.retry_after_s))
        return [(b"retry-after", str(seconds).encode()), (b"retry-after-ms", str(millis).encode())]

    def error_fields(self) -> dict[str, Any]:
        """Warden's fields of the OpenAI-style error body."""
        return {
            "warden_reason": self.reason,
            "warden_signal": self.signal,
            "warden_value": self.value,
        }


class HalfOpenGate:
    """Admits a steady fraction of requests (deterministic, so tests and operators can reason)."""

    def __init__(self) -> None:
        self._credit = 0.0

    def admit(self, fraction: float) -> bool:
        self._credit += fraction
        if self._credit >= 1.0:
            self._credit -= 1.0
            return True
        return False


@dataclass(frozen=True)
class Saturation:
    """What admission at saturation decides from: the engine's measured saturation, the
    Retry-After schedule (None: the constant admission.retry_after_s) and the time now."""

    state: SaturationState
    schedule: RetrySchedule | None = None
    now: float = 0.0
    request_key: int | None = None  # the request's body hash: a refusal books its return
    deep_factor: float = 1.0  # a deep slot's forecast is scaled by it (DeepSlotCalibration)
    # ``state`` without the places held for refused clients, where they were counted in it
    # (None: they were not): a refusal's earliest return is judged on the engine's own queue.
    # Built only for a refusal: most requests at a full batch never need it.
    engine_queue: Callable[[], SaturationState] | None = None


def _refused(refusal: Refusal, cause: Cause, retry_after_s: float) -> Decision:
    """A refusal by an action, named by the cause of the lease that holds it."""
    return Decision(
        False,
        refusal.status,
        refusal.reason,
        f"{refusal.message} ({cause.signal}: {cause.value})",
        retry_after_s,
        signal=cause.signal,
        value=cause.value,
    )


def admit(
    facts: RequestFacts,
    policy: EffectivePolicy,
    gate: HalfOpenGate,
    settings: AdmissionSettings | None = None,
    saturation: Saturation | None = None,
) -> Decision:
    """The policy's refusals, from the request's priority alone, then saturation for a typical
    request (``settings`` and ``saturation`` given): decided before the body is read. A
    refusal is named by the policy's cause for the action that refused."""
    fields = policy.view()
    for action, check in REGISTRY.refusal_checks():
        refusal = check(fields, facts.priority, gate.admit)
        if refusal is not None:
            return _refused(refusal, policy.cause(action), policy.retry_after_s)
    if settings is not None and saturation is not None:
        return _saturation(settings, saturation, None, None, 0)
    return Decision(True)


def admit_exempt(policy: EffectivePolicy) -> Decision:
    """Routes exempt from admission that still do work (tokenizing, counting, rendering) are
    refused only under ``reject_all``: they generate nothing, so stopping admission or shedding
    leaves them open, but an engine told to refuse everything refuses them too."""
    refuse = REGISTRY.by_name["reject_all"].refuse
    assert refuse is not None
    found = refuse(policy.view(), 0, lambda _fraction: True)
    if found is None:
        return Decision(True)
    return _refused(found, policy.cause("reject_all"), policy.retry_after_s)


def token_ceiling(policy: EffectivePolicy) -> int | None:
    """The most output tokens the policy lets one request generate (None: no cap)."""
    found = _tightest_cap(policy)
    return None if found is None else found[1]


def _tightest_cap(policy: EffectivePolicy) -> tuple[str, int] | None:
    """The action whose cap is the lowest, and that cap (None: no action caps)."""
    fields = policy.view()
    caps = [(a.name, c) for a in REGISTRY if a.cap is not None and (c := a.cap(fields)) is not None]
    return min(caps, key=lambda found: found[1]) if caps else None


def limit(
    facts: RequestFacts,
    policy: EffectivePolicy,
    settings: AdmissionSettings,
    kv: KvState | None = None,
    saturation: Saturation | None = None,
) -> Decision:
    """The cap, the KV forecast and saturation for an admitted request, once its body says
    what it wants (``facts.max_tokens``: the limit vLLM would apply to each sequence, None = up
    to the context length). A cap bounds the request's total: with several sequences each gets
    its share, and a request with more sequences than the cap has tokens is refused (429: its
    own size is the cause). A full cache alone never refuses: the blocks this prompt lacks
    lengthen its predicted queue wait."""
    cap = None
    max_tokens = facts.max_tokens
    tightest = _tightest_cap(policy)
    if tightest is not None:
        capped_by, ceiling = tightest
        sequences = max(1, facts.sequences)
        if sequences > ceiling:
            cause = policy.cause(capped_by)
            return Decision(
                False,
                429,
                capped_by,
                f"the request generates {sequences} sequences at once; output is capped at "
                f"{ceiling} tokens per request ({cause.signal}: {cause.value})",
                policy.retry_after_s,
                signal=cause.signal,
                value=cause.value,
            )
        share = ceiling // sequences
        if max_tokens is None or max_tokens > share:
            cap = max_tokens = share
    forecast = settings.forecast
    margin = forecast.safety_margin_blocks if forecast.enabled else 0
    prompt = facts.prompt_tokens if forecast.enabled else None
    if kv is not None and prompt is not None:
        capacity = (kv.total_blocks - margin) * kv.block_size
        if prompt + 1 > capacity:
            return Decision(
                False,
                400,
                "kv_never_fits",
                f"prompt of {prompt} tokens can never fit in the KV cache ({capacity} tokens)",
                signal="prompt_tokens",
                value=prompt,
            )
    deep = None
    if saturation is not None:
        decision = _saturation(settings, saturation, kv, prompt, margin, max_tokens)
        if not decision.admit:
            return decision
        deep = decision.deep
    return Decision(True, cap=cap, deep=deep)


def judge_saturation(settings: AdmissionSettings, saturation: Saturation) -> Decision:
    """Saturation alone, before the body is parsed or its prompt counted: the first and
    cheapest check once a request is known by its key. Nothing is known yet of what it asks
    for, so it is judged as the shortest request could be (one token, ``SHORTEST_OUTPUT``):
    refused here only where no request could meet the limits; ``limit`` judges the rest on
    their own ``max_tokens``."""
    return _saturation(settings, saturation, None, None, 0, SHORTEST_OUTPUT)


def _saturation(
    settings: AdmissionSettings,
    saturation: Saturation,
    kv: KvState | None,
    prompt: int | None,
    margin: int,
    output_tokens: int | None = None,
) -> Decision:
    """503 with a Retry-After when this request would break a saturation limit."""
    sat = settings.saturation
    if not sat.enabled:
        return Decision(True)
    state = saturation.state
    judged = assess(sat, state, kv, prompt, margin, saturation.deep_factor, output_tokens)
    found = judged.breach
    if found is None:
        return Decision(True, deep=judged.deep)
    if sat.retry_after == "computed" and saturation.schedule is not None:
        retry_s: float = saturation.schedule.book(
            saturation.now,
            _earliest_return_s(sat, saturation, found, kv, prompt, margin, output_tokens),
            batch_drain_rate(state, max(1, state.running)),
            sat.retry_after_min_s,
            sat.retry_after_max_s,
            saturation.request_key,
        )
    else:
        retry_s = settings.retry_after_s
    return Decision(
        False,
        503,
        "saturated",
        found.message(),
        retry_s,
        signal=found.signal,
        value=round(found.value, 3),
        basis=found.basis(),
    )


def _earliest_return_s(
    sat: SaturationSettings,
    saturation: Saturation,
    found: Breach,
    kv: KvState | None,
    prompt: int | None,
    margin: int,
    output_tokens: int | None,
) -> float:
    """How soon the refused request could come back and fit, judged on the engine's own
    queue: the places held for other refused clients are the schedule's slots, which books
    this one behind them. Judged behind them here as well, they were counted twice, each time
    scaled by the forecast's margins, and the returns booked after an overload ran away from
    the engine: quick check 69's 4x point held 600 places while the engine ran 0-4 requests
    for 100 s as they came back at 3-6 a second (benchmarks/README.md)."""
    if saturation.engine_queue is None:
        return found.earliest_s
    own = assess(
        sat,
        saturation.engine_queue(),
        kv,
        prompt,
        margin,
        saturation.deep_factor,
        output_tokens,
    ).breach
    return own.earliest_s if own is not None else 0.0


def decide(
    facts: RequestFacts,
    policy: EffectivePolicy,
    settings: AdmissionSettings,
    gate: HalfOpenGate,
    kv: KvState | None = None,
    saturation: Saturation | None = None,
) -> Decision:
    """``admit`` then ``limit``: one request's whole decision."""
    decision = admit(facts, policy, gate, settings, saturation)
    if not decision.admit:
        return decision
    return limit(facts, policy, settings, kv, saturation)
