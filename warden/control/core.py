"""The control core: signals and leases in, the effective policy and each change's cause out.

Pure: no metrics, no spans, no logs, no engine, no clock of its own (every call takes ``now``).
It holds the lease table and decides what each alert, override and reflex step does to it, folds
the live leases into the effective policy (cached until a lease changes or expires), keeps the
preemption cooldown, and keeps the records ``/warden/state`` shows: policy changes, recent
refusals with their cause, and for each crossing the first refusal that followed it.
``warden.control.controller.Controller`` is the adapter around it that does the I/O.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from exporter import catalog
from warden.control.actions import REGISTRY
from warden.control.actions.base import ActionRequest
from warden.control.admission import Decision
from warden.control.alertmanager import INVALID, AlertEvent
from warden.control.cause import Cause
from warden.control.config import ControlConfig
from warden.control.identity import EngineIdentity
from warden.control.leases import Lease, LeaseTable, Outcome
from warden.control.policy import EffectivePolicy, combine

ALERTMANAGER, REFLEX, MANUAL = catalog.LEASE_SOURCES
NOT_FOR_THIS_ENGINE = "not_for_this_engine"
UNKNOWN_ACTION = "unknown_action"
NOT_FOR_WARDEN = "not_for_warden"
EVICTED = "lease_evicted"  # an alert's protective lease evicted a less protective one
SATURATION_SIGNAL = "saturation"
WARDEN_RID = re.compile(r"warden-[0-9a-f]{32}")
# The alert labels a lease keeps (its identity and name); the rest is not warden's to store.
KEPT_LABELS = ("alertname", "instance", "severity", catalog.ACTION_LABEL)
PREEMPTED_REMEMBERED = 4096


@dataclass(frozen=True)
class AlertResult:
    """What one alert did: its outcome, the lease it took or released, the lease it evicted,
    the preemptions it asks for, and why it was not for this engine."""

    outcome: str
    lease: Lease | None = None
    evicted: Lease | None = None
    preempt: int = 0
    refusal: str | None = None


@dataclass(frozen=True)
class LeaseResult:
    """A manual or reflex lease change: the lease (None: refused or nothing changed), and the
    lease it evicted."""

    lease: Lease | None
    evicted: Lease | None = None


@dataclass(frozen=True)
class PolicyUpdate:
    """The policy now; the leases that expired on the way; ``live`` when it was folded anew
    (then its gauges are published), None when the cached one still holds."""

    policy: EffectivePolicy
    expired: list[Lease]
    live: list[Lease] | None


class ControlCore:
    def __init__(self, config: ControlConfig, now: float) -> None:
        self.config = config
        self.leases = LeaseTable(
            config.webhook.tombstone_ttl_s,
            config.webhook.max_tombstones,
            config.leases.max_per_source,
        )
        self._lock = threading.RLock()
        self._cached: tuple[int, EffectivePolicy] | None = None
        self._preempted: OrderedDict[str, float] = OrderedDict()
        self._last_lease_preempt: float | None = None  # alerts' and overrides' shared cooldown
        self.last_policy_change = now
        # Recent refusals with their cause: operators see a false intervention here.
        self.recent_rejections: deque[dict[str, Any]] = deque(maxlen=64)
        # (time, actions in force) at each policy change: when a lease took effect, even if no
        # request arrived to be refused then.
        self.policy_changes: deque[tuple[float, list[str]]] = deque(maxlen=64)
        # One record per crossing (memory watermark into an acting level, or saturation): when
        # it happened, and the first refusal it caused. Reaction times are read here, not from
        # the ring of recent refusals, which a flood overwrites.
        self.reactions: deque[dict[str, Any]] = deque(maxlen=32)

    def initial_policy(self) -> EffectivePolicy:
        """The policy before any lease (what is published at start)."""
        return combine([], REGISTRY.defaults(self.config.admission))

    # --- policy -------------------------------------------------------------------------

    def policy(self, now: float) -> PolicyUpdate:
        expired = self.leases.expire(now)
        with self._lock:
            version = self.leases.version
            if self._cached is not None and self._cached[0] == version:
                return PolicyUpdate(self._cached[1], expired, None)
            live = self.leases.live(now)
            policy = combine(live, REGISTRY.defaults(self.config.admission))
            if self._cached is None or self._cached[1] != policy:
                self.last_policy_change = now
                self.policy_changes.append((now, policy.active_actions()))
            self._cached = (version, policy)
            return PolicyUpdate(policy, expired, live)

    # --- lease writers ------------------------------------------------------------------

    def apply_alert(
        self, event: AlertEvent, identity: EngineIdentity | None, now: float
    ) -> AlertResult:
        """One checked alert: an alert about another engine, a malformed one or one that names
        no known action changes nothing; a firing takes or renews its lease (named by the alert
        and the value in its description), a resolved one releases it."""
        refusal = identity.refusal(event.labels) if identity is not None else None
        if event.problem is not None:
            return AlertResult(INVALID)
        if refusal is not None:
            return AlertResult(NOT_FOR_THIS_ENGINE, refusal=refusal)
        if event.unknown_action is not None:
            return AlertResult(UNKNOWN_ACTION)
        if event.request is None:
            return AlertResult(NOT_FOR_WARDEN)
        if event.status != "firing":
            outcome = self.leases.release(
                ALERTMANAGER, event.fingerprint, now, started_at=event.starts_at
            )
            return AlertResult(outcome)
        evictions = self.leases.evictions
        outcome = self.leases.renew(
            ALERTMANAGER,
            event.fingerprint,
            event.request,
            self.config.leases.ttl_s,
            now,
            started_at=event.starts_at,
            labels={name: event.labels[name] for name in KEPT_LABELS if name in event.labels},
            cause=Cause(event.alertname, event.annotations.get("description", "")),
        )
        evicted = self.leases.last_evicted if self.leases.evictions != evictions else None
        applied = outcome == Outcome.APPLIED
        return AlertResult(
            outcome,
            lease=self.leases.get(ALERTMANAGER, event.fingerprint) if applied else None,
            evicted=evicted,
            preempt=event.request.preempt if applied else 0,
        )

    def set_manual(self, key: str, request: ActionRequest, ttl_s: float, now: float) -> LeaseResult:
        """Take or renew a manual lease; no lease when the manual source holds its maximum (a
        protective action evicts the least protective manual lease instead)."""
        evictions = self.leases.evictions
        outcome = self.leases.renew(MANUAL, key, request, ttl_s, now, cause=Cause(MANUAL, key))
        if outcome == Outcome.LIMITED:
            return LeaseResult(None)
        evicted = self.leases.last_evicted if self.leases.evictions != evictions else None
        return LeaseResult(self.leases.get(MANUAL, key), evicted)

    def clear_manual(self, key: str | None, now: float) -> int:
        if key is None:
            return self.leases.release_source(MANUAL)
        return int(self.leases.release(MANUAL, key, now) == Outcome.RELEASED)

    def hold_reflex(
        self, key: str, request: ActionRequest, cause: Cause, now: float
    ) -> Lease | None:
        """Take or keep a reflex lease; renewed only when half its life is gone (cheap). A
        renewal keeps the cause the lease was taken for. The lease when newly applied."""
        ttl = self.config.reflex.lease_ttl_s
        current = self.leases.get(REFLEX, key)
        if current is not None:
            if current.params == request.params and current.expires_at - now > ttl / 2:
                return None
            cause = current.cause()
        if self.leases.renew(REFLEX, key, request, ttl, now, cause=cause) == Outcome.APPLIED:
            return self.leases.get(REFLEX, key)
        return None

    def drop_reflex(self, key: str, now: float) -> Lease | None:
        """Release a reflex lease; the lease released (None: none was held)."""
        lease = self.leases.get(REFLEX, key)
        if self.leases.release(REFLEX, key, now) == Outcome.RELEASED:
            return lease
        return None

    # --- preemption ---------------------------------------------------------------------

    def lease_preempt_since(self, now: float) -> float | None:
        """Alerts and overrides preempt at most once per cooldown, however many new
        fingerprints arrive: aborting work is the costliest thing warden does. None: allowed
        (and the cooldown starts now); else the seconds since the last one."""
        with self._lock:
            last = self._last_lease_preempt
            if last is not None and now - last < self.config.leases.preempt_cooldown_s:
                return now - last
            self._last_lease_preempt = now
            return None

    def mark_preempted(self, request_ids: list[str], now: float) -> None:
        """Remember the requests warden aborted, by warden's own id: their failure is retried."""
        with self._lock:
            for rid in request_ids:
                match = WARDEN_RID.search(rid)
                self._preempted[match.group(0) if match else rid] = now
            while len(self._preempted) > PREEMPTED_REMEMBERED:
                self._preempted.popitem(last=False)

    def was_preempted(self, warden_rid: str) -> bool:
        with self._lock:
            return warden_rid in self._preempted

    # --- records ------------------------------------------------------------------------

    def record_rejection(self, decision: Decision, now: float) -> None:
        """Keep a refusal with its cause; close any crossing still waiting for its first."""
        record: dict[str, Any] = {
            "at": now,
            "reason": decision.reason,
            "signal": decision.signal,
            "value": decision.value,
            "retry_after_s": round(float(decision.retry_after_s), 3),
        }
        if decision.basis:
            record["basis"] = decision.basis
        self.recent_rejections.append(record)
        for reaction in list(self.reactions):
            if reaction["first_refusal_at"] is None and _caused_by(decision, reaction["kind"]):
                reaction["first_refusal_at"] = now
                reaction["reaction_s"] = round(now - reaction["crossed_at"], 4)
                reaction["first_refusal"] = decision.reason

    def note_crossing(self, kind: str, cause: Cause, at: float) -> None:
        """A signal crossed into a level that refuses: time it until the first refusal."""
        self.reactions.append(
            {
                "kind": kind,
                "signal": cause.signal,
                "value": cause.value,
                "crossed_at": at,
                "first_refusal_at": None,
                "reaction_s": None,
                "first_refusal": None,
            }
        )

    def state_json(self, policy: EffectivePolicy, now: float) -> dict[str, Any]:
        leases = []
        for lease in self.leases.live(now):
            cause = lease.cause()
            leases.append(
                {**lease.to_json(), "cause": {"signal": cause.signal, "value": cause.value}}
            )
        return {
            "policy": policy.to_json(),
            "leases": leases,
            "last_policy_change": self.last_policy_change,
            "recent_rejections": list(self.recent_rejections),
            "policy_changes": [
                {"at": at, "active": active} for at, active in list(self.policy_changes)
            ],
            "reactions": [dict(r) for r in self.reactions],
        }


def _caused_by(decision: Decision, kind: str) -> bool:
    """Whether a refusal answers a crossing of ``kind``."""
    if kind == SATURATION_SIGNAL:
        return decision.reason == "saturated"
    return decision.signal == kind
