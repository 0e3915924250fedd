"""The API process's control adapter: the pure core (``warden.control.core``) plus the I/O.

One Controller per API server process. The webhook, manual overrides and the reflex write
leases through it; the saturation watch hands it the engine's saturation every step; the
admission middleware asks ``admit()`` (before the body) and ``limit()`` (with it) on every
request. Deciding is the core's (leases, the effective policy and each action's cause) and
admission's (``warden.control.admission``); this class reads the clock and the engine, and
writes what was decided out: the degradation and saturation gauges, a span for every lease
change, the log lines, and the preemptions it asks the engine for.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from exporter import catalog, vllm_compat
from exporter.metrics import WardenMetrics
from exporter.saturation import SaturationState
from warden.control import admission, telemetry
from warden.control.actions import REGISTRY
from warden.control.actions.base import ActionRequest
from warden.control.admission import Decision, HalfOpenGate, RequestFacts, Saturation
from warden.control.alertmanager import INVALID, AlertEvent, check_times
from warden.control.cause import Cause
from warden.control.config import ControlConfig
from warden.control.core import (
    ALERTMANAGER,
    EVICTED,
    MANUAL,
    NOT_FOR_THIS_ENGINE,
    REFLEX,
    SATURATION_SIGNAL,
    UNKNOWN_ACTION,
    WARDEN_RID,
    AlertResult,
    ControlCore,
)
from warden.control.identity import EngineIdentity
from warden.control.leases import Lease, LeaseTable, Outcome
from warden.control.offered_load import OfferedLoad
from warden.control.policy import CIRCUIT_ORDER, EffectivePolicy, gauge_values
from warden.control.saturation import (
    SATURATED,
    DeepAdmission,
    DeepSlotCalibration,
    KvState,
    RetrySchedule,
    SaturationChange,
    SaturationJudge,
    startable_now,
    with_live_queue,
)

__all__ = [
    "ALERTMANAGER",
    "EVICTED",
    "MANUAL",
    "NOT_FOR_THIS_ENGINE",
    "REFLEX",
    "SATURATION_SIGNAL",
    "WARDEN_RID",
    "Controller",
]

log = logging.getLogger("warden.control")
LOGGED_PER_NOTIFICATION = 5  # refused alerts logged one by one; the rest in one line


class Controller:
    def __init__(
        self,
        config: ControlConfig,
        metrics: WardenMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.clock = clock
        self.core = ControlCore(config, clock())
        self.engine_client: Any = None
        self._lock = threading.RLock()
        self._foreign_logged: set[tuple[str, str]] = set()
        self.gate = HalfOpenGate()
        self.retry_schedule = RetrySchedule()
        # How late requests admitted into a full batch's deep slots ran against their forecast.
        self.deep_slots = DeepSlotCalibration(clock=clock)
        # Requests offered per second where a saturation limit is set: an overload's onset.
        self.offered = OfferedLoad()
        self.saturation = SaturationState()
        self.admitted_in_flight = 0  # admitted by the middleware, not yet answered
        self.saturation_judge: SaturationJudge | None = None
        self.saturation_changes: deque[dict[str, Any]] = deque(maxlen=64)
        self._saturated = metrics.get(catalog.SATURATED)
        self._saturated.set(0)
        self._saturation_transitions = metrics.get(catalog.SATURATION_TRANSITIONS)
        # Exported at 0 from the start, like the reflex actions: a series born at 1 hides its
        # first event from increase() (and leaves its panel without data until then).
        for entered in catalog.SATURATION_STATES:
            self._saturation_transitions.labels(entered)
        slo = config.admission.saturation.latency_slo_s
        metrics.get(catalog.LATENCY_SLO).set(slo or 0)
        admitted_slo = metrics.get(catalog.ADMITTED_SLO)
        within, missed = catalog.SLO_OUTCOMES
        self._slo_within = admitted_slo.labels(within)
        self._slo_missed = admitted_slo.labels(missed)
        self._active = metrics.get(catalog.DEGRADATION_ACTIVE)
        self._lease_count = metrics.get(catalog.DEGRADATION_LEASES)
        self._circuit = metrics.get(catalog.CIRCUIT_BREAKER_STATE)
        self.rejections = metrics.get(catalog.ADMISSION_REJECTIONS)
        self.capped = metrics.get(catalog.MAX_TOKENS_CAPPED)
        self.notifications = metrics.get(catalog.WEBHOOK_NOTIFICATIONS)
        self.retries = metrics.get(catalog.REQUEST_RETRIES)
        self.retries_exhausted = metrics.get(catalog.REQUEST_RETRIES_EXHAUSTED)
        self._reflex_actions = metrics.get(catalog.REFLEX_ACTIONS)
        self._preemptions = metrics.get(catalog.WARDEN_PREEMPTIONS)
        metrics.ensure([catalog.MAX_TOKENS_CAPPED, catalog.WARDEN_PREEMPTIONS])
        # Every action the reflex may take is exported at 0 from the start: a series born at 1
        # would hide its first event from increase() (and leave its panel without data).
        for action in REGISTRY.reflex_names():
            self._reflex_actions.labels(action)
        self._publish(self.core.initial_policy(), [])

    # --- the core's state, read where it always was ---------------------------------------

    @property
    def leases(self) -> LeaseTable:
        return self.core.leases

    @property
    def last_policy_change(self) -> float:
        return self.core.last_policy_change

    @property
    def recent_rejections(self) -> deque[dict[str, Any]]:
        return self.core.recent_rejections

    @property
    def policy_changes(self) -> deque[tuple[float, list[str]]]:
        return self.core.policy_changes

    @property
    def reactions(self) -> deque[dict[str, Any]]:
        return self.core.reactions

    # --- policy -------------------------------------------------------------------------

    def policy(self) -> EffectivePolicy:
        update = self.core.policy(self.clock())
        for lease in update.expired:
            self._span("warden.lease.expire", lease)
        if update.live is not None:
            self._publish(update.policy, update.live)
        return update.policy

    def _publish(self, policy: EffectivePolicy, live: list[Lease]) -> None:
        for action, value in gauge_values(policy).items():
            self._active.labels(action).set(value)
        for source in catalog.LEASE_SOURCES:
            self._lease_count.labels(source).set(sum(1 for x in live if x.source == source))
        self._circuit.set(CIRCUIT_ORDER[policy.circuit])

    def _span(self, name: str, lease: Lease | None = None, **attributes: Any) -> None:
        with telemetry.tracer().start_as_current_span(name) as span:
            if lease is not None:
                span.set_attribute("warden.action", lease.action)
                span.set_attribute("warden.source", lease.source)
                span.set_attribute("warden.lease.key", lease.key)
                span.set_attribute("warden.lease.expires_at", lease.expires_at)
                if lease.labels.get("alertname"):
                    span.set_attribute("warden.alertname", lease.labels["alertname"])
            for key, value in attributes.items():
                span.set_attribute(f"warden.{key}", value)

    # --- lease writers ------------------------------------------------------------------

    def apply_alerts(
        self, events: list[AlertEvent], identity: EngineIdentity | None = None
    ) -> dict[str, int]:
        """Apply a checked notification; return counts per outcome.

        With ``identity`` (the webhook always passes it), alerts about another engine or about
        the whole fleet are counted ``not_for_this_engine`` and change nothing. An alert that
        failed its checks, or whose times this server's clock cannot believe, is counted
        ``invalid`` and logged; the others still apply.
        """
        now = self.clock()
        counts: dict[str, int] = {}
        preempt = 0
        for event in self.checked(events):
            result = self.core.apply_alert(event, identity, now)
            self._report(event, result, counts)
            if result.evicted is not None:
                counts[EVICTED] = counts.get(EVICTED, 0) + 1
            counts[result.outcome] = counts.get(result.outcome, 0) + 1
            preempt = max(preempt, result.preempt)
        if counts.get(INVALID, 0) > LOGGED_PER_NOTIFICATION:
            log.warning(
                "warden: %d more alerts of this notification not applied (named in its answer)",
                counts[INVALID] - LOGGED_PER_NOTIFICATION,
            )
        self.policy()
        if preempt and self._lease_preempt_allowed(now, "alert"):
            self.preempt_largest(preempt, "alert")
        return counts

    def _report(self, event: AlertEvent, result: AlertResult, counts: dict[str, int]) -> None:
        """The log lines and spans of one alert's outcome (before it is counted)."""
        outcome = result.outcome
        quiet = counts.get(outcome, 0) >= LOGGED_PER_NOTIFICATION
        if outcome == INVALID and not quiet:
            log.warning(
                "warden: alert %r (%r) not applied: %r",
                event.alertname[:64] or "?",
                event.fingerprint[:32],
                (event.problem or "")[:300],
            )
        elif outcome == NOT_FOR_THIS_ENGINE and result.refusal is not None:
            self._log_foreign(event, result.refusal)
        elif outcome == UNKNOWN_ACTION and not quiet:
            log.warning(
                "warden: alert %r asks for unknown action %r; ignored",
                event.alertname[:64],
                (event.unknown_action or "")[:64],
            )
        elif outcome == Outcome.LIMITED and not quiet:
            log.warning(
                "warden: alert %r (%r) refused: Alertmanager already holds %d leases",
                event.alertname,
                event.fingerprint,
                self.leases.max_per_source,
            )
        if result.evicted is not None and event.request is not None:
            self._log_eviction(result.evicted, event.alertname, event.request.action)
        if outcome in (Outcome.APPLIED, Outcome.RELEASED):
            self._span(
                f"warden.lease.{outcome}",
                result.lease,
                alertname=event.alertname,
                action=event.request.action if event.request else "",
                source=ALERTMANAGER,
            )

    def checked(self, events: list[AlertEvent]) -> list[AlertEvent]:
        """``events`` with a ``problem`` set on each whose times this server's clock cannot
        believe (``webhook.max_clock_skew_s`` ahead, ``max_alert_age_s`` behind)."""
        now = self.clock()
        hook = self.config.webhook
        out = []
        for event in events:
            if event.problem is None and event.status != INVALID:
                problem = check_times(event, now, hook.max_clock_skew_s, hook.max_alert_age_s)
                if problem is not None:
                    event = dataclasses.replace(event, problem=problem)
            out.append(event)
        return out

    def _log_eviction(self, victim: Lease, alertname: str, action: str) -> None:
        log.warning(
            "warden: leases full: %s lease %r (%s) evicted for %s from %r",
            victim.source,
            victim.key[:32],
            victim.action,
            action,
            alertname[:64],
        )
        self._span("warden.lease.evicted", victim)

    def _log_foreign(self, event: AlertEvent, refusal: str) -> None:
        """Say once per alert and reason that an alert was not applied here (a misrouted
        notification is a configuration problem someone should see, not a flood)."""
        key = (event.fingerprint, refusal)
        if key in self._foreign_logged:
            return
        self._foreign_logged.add(key)
        if len(self._foreign_logged) > 1024:
            self._foreign_logged.clear()
        log.warning("warden: alert %s not applied: %s", event.alertname, refusal)

    def set_manual(self, key: str, request: ActionRequest, ttl_s: float) -> Lease | None:
        """Take or renew a manual lease; None when the manual source holds its maximum (a
        protective action evicts the least protective manual lease instead)."""
        now = self.clock()
        result = self.core.set_manual(key, request, ttl_s, now)
        if result.lease is None:
            return None
        if result.evicted is not None:
            self._log_eviction(result.evicted, f"manual override {key[:64]}", request.action)
        self._span("warden.lease.applied", result.lease)
        self.policy()
        if request.preempt and self._lease_preempt_allowed(now, "manual"):
            self.preempt_largest(request.preempt, "manual")
        return result.lease

    def _lease_preempt_allowed(self, now: float, reason: str) -> bool:
        since = self.core.lease_preempt_since(now)
        if since is not None:
            log.info(
                "warden: %s preemption skipped: last one %.1fs ago (cooldown %.0fs)",
                reason,
                since,
                self.config.leases.preempt_cooldown_s,
            )
        return since is None

    def clear_manual(self, key: str | None) -> int:
        cleared = self.core.clear_manual(key, self.clock())
        self.policy()
        return cleared

    def hold_reflex(self, key: str, request: ActionRequest, cause: Cause) -> None:
        """Take or keep a reflex lease (the core renews it only when half its life is gone)."""
        lease = self.core.hold_reflex(key, request, cause, self.clock())
        if lease is not None:
            self._reflex_actions.labels(request.action).inc()
            self._span("warden.lease.applied", lease)
            self.policy()  # in force from this step on, and recorded as such

    def drop_reflex(self, key: str) -> None:
        lease = self.core.drop_reflex(key, self.clock())
        if lease is not None:
            self._span("warden.lease.released", lease)
            self.policy()

    # --- preemption ---------------------------------------------------------------------

    def preempt_largest(self, count: int, reason: str) -> None:
        """Abort the ``count`` requests holding the most KV; the middleware resubmits them."""
        client = self.engine_client
        if client is None or count <= 0:
            return
        candidates = sorted(vllm_compat.inflight_requests(client), key=lambda r: -r[1])
        victims = [rid for rid, _tokens in candidates[:count]]
        if not victims:
            return
        self.core.mark_preempted(victims, self.clock())
        self._preemptions.inc(len(victims))
        self._span("warden.preempt", reason=reason, count=len(victims))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.create_task(client.abort(victims))

    def was_preempted(self, warden_rid: str) -> bool:
        return self.core.was_preempted(warden_rid)

    # --- admission ----------------------------------------------------------------------

    def _saturation(self, request_key: int | None = None) -> Saturation:
        now = self.clock()
        # A refused client's return is judged without the places held for the others: they
        # are behind it, not ahead.
        held = not self.retry_schedule.is_return(now, request_key)
        state, engine_queue = self.live_queues(held)
        return Saturation(
            state,
            self.retry_schedule,
            now,
            request_key,
            self.deep_slots.factor(),
            engine_queue,
        )

    def live_saturation(self, held: bool = True) -> SaturationState:
        """The last step's saturation with the queue as it is now: the requests warden has
        admitted and not yet answered, or vLLM's own unfinished count if higher, and, while
        the batch is full and ``held``, the places held for refused requests whose clients
        are expected back (a free slot is taken at once: places held never leave the engine
        idle), and how long each started request has been served."""
        return self.live_queues(held)[0]

    def live_queues(
        self, held: bool = True
    ) -> tuple[SaturationState, Callable[[], SaturationState] | None]:
        """``live_saturation``, and how to build the same without the places held where they
        were counted (else None): the queue in the engine alone, which a refusal's earliest
        return is judged on (the schedule books it behind the places held). Built on demand:
        only a refusal reads it."""
        in_flight = max(
            self.admitted_in_flight, vllm_compat.unfinished_requests(self.engine_client) or 0
        )
        capacity = vllm_compat.max_num_seqs(self.engine_client)
        returns = 0
        if held and capacity is not None and in_flight >= capacity:
            returns = self.retry_schedule.expected_returns(self.clock())
        kv_blocks = vllm_compat.kv_geometry(self.engine_client)
        found = vllm_compat.served_requests(self.engine_client)
        offered = self._offered_rate()

        def queue(unfinished: int) -> SaturationState:
            return with_live_queue(
                self.saturation,
                unfinished,
                capacity,
                kv_blocks,
                found.served_ages,
                found.served_limits,
                found.queued_limits,
                offered,
            )

        state = queue(in_flight + returns)
        return state, functools.partial(queue, in_flight) if returns else None

    def _offered_rate(self) -> float | None:
        """Requests offered per second now (``OfferedLoad``); None where no saturation limit
        is set, and none is counted."""
        if not self.config.admission.saturation.enabled:
            return None
        return self.offered.rate(self.clock())

    @contextlib.contextmanager
    def serving(
        self, request_key: int | None = None, deep: DeepAdmission | None = None
    ) -> Iterator[None]:
        """Counts an admitted request as in flight until it is answered (see live_saturation);
        a refused client's return takes the place held for it. A request admitted into a deep
        slot (``deep``) teaches the deep-slot calibration its real latency."""
        admitted_at = self.clock()
        self.retry_schedule.claim(admitted_at, request_key)
        with self._lock:
            self.admitted_in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self.admitted_in_flight -= 1
            slo = self.config.admission.saturation.latency_slo_s
            if slo is not None:
                latency = self.clock() - admitted_at
                (self._slo_within if latency <= slo else self._slo_missed).inc()
                if deep is not None:
                    self.deep_slots.observe(deep, latency)

    def admit(
        self,
        facts: RequestFacts,
        policy: EffectivePolicy,
        gate: HalfOpenGate | None = None,
        saturation_with_body: bool = False,
    ) -> Decision:
        """Before the body: the policy's refusals (each naming its cause) and saturation for a
        typical request, unless ``saturation_with_body``: a route whose body warden reads is
        judged on saturation once its body is known, so a refused client's return is told
        from a new arrival (``limit``). Each request judged here is offered load
        (``OfferedLoad``) where a saturation limit is set."""
        if self.config.admission.saturation.enabled:
            self.offered.note(self.clock())
        saturation = None if saturation_with_body else self._saturation()
        return admission.admit(facts, policy, gate or self.gate, self.config.admission, saturation)

    def judge_saturation(self, request_key: int | None) -> Decision:
        """Saturation for a typical request known by its key: a body route's first check once
        its bytes are in, so a refusal costs no parsing and no token count."""
        return admission.judge_saturation(self.config.admission, self._saturation(request_key))

    def limit(
        self, facts: RequestFacts, policy: EffectivePolicy, kv: KvState | None = None
    ) -> Decision:
        """With the body: the cap, the KV forecast and saturation for this request's prompt
        (the live queue is read only when a saturation limit is set)."""
        judged = self.config.admission.saturation.enabled
        saturation = self._saturation(facts.request_key) if judged else None
        return admission.limit(facts, policy, self.config.admission, kv, saturation)

    def decide(
        self, facts: RequestFacts, kv: KvState | None = None, gate: HalfOpenGate | None = None
    ) -> Decision:
        """``admit`` then ``limit`` for one request, against the policy in force now
        (saturation judged once, with what the body says, as for a completion)."""
        policy = self.policy()
        decision = self.admit(facts, policy, gate, saturation_with_body=True)
        return self.limit(facts, policy, kv) if decision.admit else decision

    def record_rejection(self, decision: Decision | str) -> None:
        """Count a refusal; keep it with its cause; close any crossing still waiting for its
        first refusal."""
        if isinstance(decision, str):  # a bare reason (older callers)
            decision = Decision(False, 503, decision)
        self.rejections.labels(decision.reason).inc()
        self.core.record_rejection(decision, self.clock())

    def note_crossing(self, kind: str, cause: Cause, at: float) -> None:
        """A signal crossed into a level that refuses: time it until the first refusal."""
        self.core.note_crossing(kind, cause, at)

    def observe_saturation(
        self, state: SaturationState, judge: SaturationJudge, change: SaturationChange | None
    ) -> None:
        """Each step: the engine's saturation (admission reads it) and any change of state."""
        self.saturation = state
        self.saturation_judge = judge
        if change is None:
            return
        saturated = change.entered == SATURATED
        self._saturated.set(1 if saturated else 0)
        self._saturation_transitions.labels(change.entered).inc()
        record: dict[str, Any] = {"at": change.at, "state": change.entered}
        if change.breach is not None:
            record.update(signal=change.breach.signal, value=round(change.breach.value, 3))
            self.note_crossing(
                SATURATION_SIGNAL,
                Cause(change.breach.signal, round(change.breach.value, 3)),
                change.at,
            )
        self.saturation_changes.append(record)

    # --- state --------------------------------------------------------------------------

    def _measured(self, capacity: int | None) -> SaturationState:
        """The last step's measurements with what the meter does not know and admission
        does (``with_live_queue``): the batch's size limit and the requests offered now."""
        state = self.saturation
        offered = self._offered_rate()
        if capacity is None or state.capacity is not None:
            return dataclasses.replace(state, offered_per_s=offered)
        return dataclasses.replace(state, capacity=capacity, offered_per_s=offered)

    def saturation_json(self) -> dict[str, Any]:
        judge = self.saturation_judge
        limits = self.config.admission.saturation
        kv_blocks = vllm_compat.kv_geometry(self.engine_client)
        capacity = vllm_compat.max_num_seqs(self.engine_client)
        found = vllm_compat.served_requests(self.engine_client)
        return {
            "state": judge.state if judge is not None else "normal",
            "since": judge.since if judge is not None else None,
            "breach": (
                {"signal": judge.breach.signal, "value": round(judge.breach.value, 3)}
                if judge is not None and judge.breach is not None
                else None
            ),
            "limits": {
                "latency_slo_s": limits.latency_slo_s,
                "max_queue_wait_s": limits.max_queue_wait_s,
                "max_queue_depth": limits.max_queue_depth,
            },
            # As admission sees it: with the batch's size limit (the pace margin needs it).
            "measured": self._measured(capacity).to_json(),
            # How much later than forecast the requests admitted into deep slots (behind half
            # a batch or more) ran: their forecast is scaled by the factor (assess).
            "deep_slots": self.deep_slots.to_json(),
            # The KV cache's blocks and tokens per block, as this API server knows them: without
            # them every request vLLM reported waiting is taken to wait for a slot to free.
            "kv_blocks": kv_blocks,
            # Of those reported waiting, how many vLLM starts at its next step (no queue).
            "startable_now": startable_now(self.saturation, capacity, kv_blocks) if capacity else 0,
            # What admission judges the queue from between two steps (live_saturation).
            "in_flight": {
                "admitted": self.admitted_in_flight,
                "engine": vllm_compat.unfinished_requests(self.engine_client),
                # Seconds each started request has been served, oldest first, and the most
                # tokens each may generate: the batch's first slots free when these end
                # (predicted_wait).
                "served_s": [round(age, 3) for age in found.served_ages],
                "served_max_tokens": list(found.served_limits),
                # The same of the requests not scheduled yet, in the order they arrived: the
                # queue's slots free as these end in turn (predicted_wait).
                "queued_max_tokens": list(found.queued_limits),
                # Refused requests told when to come back: new arrivals queue behind them.
                "places_held": self.retry_schedule.held(self.clock()),
                # The share of recent places whose client came back: how many of those held
                # new arrivals queue behind.
                "return_share": round(self.retry_schedule.return_share(self.clock()), 3),
                # Bookings ended since start: the request came back, or never did.
                "returned": self.retry_schedule.returned,
                "lapsed": self.retry_schedule.lapsed,
                # The drain rate the last refusal's return was spaced by (requests/s).
                "booking_drain_rate_per_s": self.retry_schedule.last_drain_rate,
            },
            "changes": list(self.saturation_changes),
        }

    def state_json(self) -> dict[str, Any]:
        policy = self.policy()
        state = self.core.state_json(policy, self.clock())
        state["saturation"] = self.saturation_json()
        return state
