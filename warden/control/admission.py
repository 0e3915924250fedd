"""Per-request admission: the effective policy and the KV forecast applied to one request.

Pure: facts in, decision out. The middleware gathers the facts (priority, max_tokens, prompt
tokens) and carries out the decision (answer 503/429/400, or rewrite max_tokens). It asks in
two steps: ``admit`` (the policy's refusals, before the request's body is read) and ``limit``
(the cap and the KV forecast, which need the body); ``decide`` is both at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from warden.control.actions import REGISTRY
from warden.control.config import AdmissionSettings
from warden.control.policy import EffectivePolicy


@dataclass(frozen=True)
class RequestFacts:
    priority: int = 0
    max_tokens: int | None = None
    prompt_tokens: int | None = None


@dataclass(frozen=True)
class KvState:
    """KV cache geometry and use, from vLLM's cache config and its last step."""

    total_blocks: int
    block_size: int
    usage: float  # 0..1

    def free_blocks(self, margin: int) -> int:
        return int(self.total_blocks * (1.0 - self.usage)) - margin

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)


@dataclass(frozen=True)
class Decision:
    admit: bool
    status: int = 200
    reason: str = ""
    message: str = ""
    retry_after_s: int = 0
    cap: int | None = None  # write this max_tokens into the request


def _refuse(status: int, reason: str, message: str, retry_after: int) -> Decision:
    return Decision(False, status, reason, message, retry_after if status != 400 else 0)


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


def admit(facts: RequestFacts, policy: EffectivePolicy, gate: HalfOpenGate) -> Decision:
    """The policy's refusals, from the request's priority alone: decided before its body is
    read, so a refused request costs nothing."""
    retry = policy.retry_after_s
    checks = [a.refuse for a in REGISTRY] + [a.refuse_last for a in REGISTRY]
    for check in checks:
        refusal = check(policy, facts.priority, gate.admit) if check is not None else None
        if refusal is not None:
            return _refuse(refusal.status, refusal.reason, refusal.message, retry)
    return Decision(True)


def limit(
    facts: RequestFacts,
    policy: EffectivePolicy,
    settings: AdmissionSettings,
    kv: KvState | None = None,
) -> Decision:
    """The cap and the KV forecast for an admitted request, once its body says what it wants
    (``facts.max_tokens``: the limit vLLM would apply, None = up to the context length)."""
    retry = policy.retry_after_s
    cap = None
    max_tokens = facts.max_tokens
    for action in REGISTRY:
        ceiling = action.cap(policy) if action.cap is not None else None
        if ceiling is not None and (max_tokens is None or max_tokens > ceiling):
            cap = max_tokens = ceiling
    forecast = settings.forecast
    if kv is not None and forecast.enabled and facts.prompt_tokens is not None:
        capacity = (kv.total_blocks - forecast.safety_margin_blocks) * kv.block_size
        if facts.prompt_tokens + 1 > capacity:
            return _refuse(
                400,
                "kv_never_fits",
                f"prompt of {facts.prompt_tokens} tokens can never fit in the KV cache "
                f"({capacity} tokens)",
                0,
            )
        free_tokens = kv.free_blocks(forecast.safety_margin_blocks) * kv.block_size
        wanted = facts.prompt_tokens + (max_tokens if max_tokens is not None else 0)
        if max_tokens is not None and wanted > free_tokens:
            room = free_tokens - facts.prompt_tokens
            if room >= forecast.min_max_tokens:
                cap = room
            else:
                return _refuse(
                    429,
                    "kv_headroom",
                    f"request needs {wanted} tokens of KV cache, {max(free_tokens, 0)} free",
                    retry,
                )
    return Decision(True, cap=cap)


def decide(
    facts: RequestFacts,
    policy: EffectivePolicy,
    settings: AdmissionSettings,
    gate: HalfOpenGate,
    kv: KvState | None = None,
) -> Decision:
    """``admit`` then ``limit``: one request's whole decision."""
    decision = admit(facts, policy, gate)
    return limit(facts, policy, settings, kv) if decision.admit else decision
