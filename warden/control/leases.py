"""Degradation leases: every active action is held by someone, and lapses on its own.

A lease is (source, key) -> action + params + expiry. Alertmanager's leases are keyed by the
alert's fingerprint and carry its ``startsAt``; firing renews, resolved releases, and silence
lets the lease expire, so a lost notification can never leave the engine degraded.

Idempotent under duplicates, reordering and replays: a firing whose ``startsAt`` is not newer
than a resolution already applied for that fingerprint is stale and ignored; a resolution for
an older ``startsAt`` than the live lease does not release it.

Bounded: each source holds at most ``max_per_source`` live leases, and at most
``max_tombstones`` resolutions are remembered (the oldest is forgotten first), so no sender can
grow the table without limit. A new lease beyond the bound is refused as ``limited`` (renewals
of held ones still work), except a protective one (``reject_all``, ``stop_admission``): safety
first, it evicts the source's least protective lease (the least recently renewed among equals)
and is applied, counted in ``evictions``.

A tombstone answers the firing it resolves: a newer firing of the same fingerprint makes it
moot and removes it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from warden.control.actions import REGISTRY
from warden.control.actions.base import ActionRequest
from warden.control.cause import Cause

# The key of the manual stop_admission lease the supervisor takes to drain an engine before a
# planned restart (warden/supervisor/drain.py). Its refusals also close the connection
# (warden/engine/middleware.py): the server it reaches is about to go away.
DRAIN_LEASE_KEY = "supervisor-drain"


@dataclass(frozen=True)
class Lease:
    source: str
    key: str
    action: str
    params: dict[str, Any]
    expires_at: float
    started_at: float = 0.0
    renewed_at: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    # What made its holder take it (bounded: ``Cause.kept``); None: named by its alert or source.
    caused_by: Cause | None = None

    def cause(self) -> Cause:
        """The signal and value behind this lease."""
        if self.caused_by is not None:
            return self.caused_by
        return Cause(self.labels.get("alertname") or self.source)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "key": self.key,
            "action": self.action,
            "params": self.params,
            "expires_at": self.expires_at,
            "started_at": self.started_at,
            "renewed_at": self.renewed_at,
            "alertname": self.labels.get("alertname"),
        }


class Outcome:
    APPLIED = "applied"
    RENEWED = "renewed"
    RELEASED = "released"
    STALE = "stale"
    NOOP = "noop"
    LIMITED = "limited"  # refused: the source already holds its maximum of leases


class LeaseTable:
    """Thread-safe; every mutation bumps ``version`` so readers can cache the policy."""

    def __init__(
        self,
        tombstone_ttl_s: float = 86400.0,
        max_tombstones: int = 10_000,
        max_per_source: int = 256,
    ) -> None:
        self._leases: dict[tuple[str, str], Lease] = {}
        # key -> (startsAt, recorded at), oldest recorded first.
        self._resolved: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._tombstone_ttl_s = tombstone_ttl_s
        self.max_tombstones = max_tombstones
        self.max_per_source = max_per_source
        self._next_prune = 0.0  # tombstones are pruned once a minute, not on every request
        self._lock = threading.RLock()
        self.version = 0
        self.evictions = 0  # leases evicted to make room for a protective one
        self.last_evicted: Lease | None = None

    def renew(
        self,
        source: str,
        key: str,
        request: ActionRequest,
        ttl_s: float,
        now: float,
        started_at: float | None = None,
        labels: dict[str, str] | None = None,
        cause: Cause | None = None,
    ) -> str:
        started = now if started_at is None else started_at
        with self._lock:
            tomb = self._resolved.get(key)
            if started_at is not None and tomb is not None and started_at <= tomb[0]:
                return Outcome.STALE
            current = self._leases.get((source, key))
            if current is not None and started_at is not None and started < current.started_at:
                return Outcome.STALE  # an older firing replayed after a newer one
            if current is None and self.count(source) >= self.max_per_source:
                if not REGISTRY.protective(request.action):
                    return Outcome.LIMITED
                self._evict_least_protective(source)
            if tomb is not None and started_at is not None:
                del self._resolved[key]  # a newer firing: the resolution it answered is moot
            lease = Lease(
                source,
                key,
                request.action,
                dict(request.params),
                expires_at=now + ttl_s,
                started_at=started,
                renewed_at=now,
                labels=dict(labels or {}),
                caused_by=None if cause is None else cause.kept(),
            )
            self._leases[(source, key)] = lease
            self.version += 1
            return Outcome.APPLIED if current is None else Outcome.RENEWED

    def _evict_least_protective(self, source: str) -> None:
        victim = min(
            (lease for (held_by, _key), lease in self._leases.items() if held_by == source),
            key=lambda lease: (REGISTRY.protection(lease.action), lease.renewed_at),
        )
        del self._leases[(victim.source, victim.key)]
        self.evictions += 1
        self.last_evicted = victim

    def release(self, source: str, key: str, now: float, started_at: float | None = None) -> str:
        with self._lock:
            if started_at is not None:
                tomb = self._resolved.get(key)
                if tomb is None or started_at > tomb[0]:
                    self._resolved[key] = (started_at, now)
                    self._resolved.move_to_end(key)
                    while len(self._resolved) > self.max_tombstones:
                        self._resolved.popitem(last=False)
            current = self._leases.get((source, key))
            if current is None:
                return Outcome.NOOP
            if started_at is not None and started_at < current.started_at:
                return Outcome.STALE  # resolves an older incarnation of the alert
            del self._leases[(source, key)]
            self.version += 1
            return Outcome.RELEASED

    def count(self, source: str) -> int:
        with self._lock:
            return sum(1 for lease_source, _key in self._leases if lease_source == source)

    def tombstones(self) -> int:
        with self._lock:
            return len(self._resolved)

    def release_source(self, source: str) -> int:
        with self._lock:
            keys = [k for k in self._leases if k[0] == source]
            for k in keys:
                del self._leases[k]
            if keys:
                self.version += 1
            return len(keys)

    def expire(self, now: float) -> list[Lease]:
        with self._lock:
            gone = [lease for lease in self._leases.values() if lease.expires_at <= now]
            for lease in gone:
                del self._leases[(lease.source, lease.key)]
            if now >= self._next_prune:
                self._next_prune = now + 60.0
                while self._resolved:  # oldest first: stop at the first one still kept
                    _started, recorded = next(iter(self._resolved.values()))
                    if now - recorded <= self._tombstone_ttl_s:
                        break
                    self._resolved.popitem(last=False)
            if gone:
                self.version += 1
            return gone

    def live(self, now: float) -> list[Lease]:
        with self._lock:
            return sorted(
                (lease for lease in self._leases.values() if lease.expires_at > now),
                key=lambda lease: (lease.source, lease.key),
            )

    def get(self, source: str, key: str) -> Lease | None:
        with self._lock:
            return self._leases.get((source, key))

    def snapshot(self) -> dict[tuple[str, str], Lease]:
        with self._lock:
            return {k: replace(v) for k, v in self._leases.items()}
