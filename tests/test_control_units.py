"""The control loop's logic in-process: leases, policy, payload parsing, admission, reflex.

No fakes: the real Controller with its own registry; only the clock is controlled."""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import json
import math
import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from benchmarks.retry_after import SimulatedEngineClient
from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.saturation import PACE_MIN_CHANGES, SaturationMeter, SaturationState
from exporter.settings import WardenSettings
from exporter.signals import SignalBoard
from exporter.step_monitor import StepMonitor, StepSnapshot
from tests.support.alertmanager import webhook_notification
from warden.control.actions import REFLEX_ACTIONS, ActionError, ActionRequest, parse_action
from warden.control.admission import (
    Decision,
    HalfOpenGate,
    KvState,
    RequestFacts,
    Saturation,
    decide,
)
from warden.control.alertmanager import PayloadError, parse_payload
from warden.control.config import (
    RETRY_AFTER_MAX_S,
    AdmissionSettings,
    ControlConfig,
    ControlConfigError,
    QueueLevel,
    ReflexSettings,
    SaturationSettings,
    load_config,
    parse_config,
)
from warden.control.controller import Controller
from warden.control.leases import LeaseTable
from warden.control.offered_load import OFFERED_WINDOW_S, sure_count
from warden.control.policy import EffectivePolicy, combine
from warden.control.reflex import Reflex
from warden.control.retry import backoff_s, classify_failure
from warden.control.saturation import (
    DEEP_MIN_SAMPLES,
    RETURN_UTILISATION,
    DeepAdmission,
    DeepSlotCalibration,
    RetrySchedule,
    SaturationWatch,
    breach,
    with_live_queue,
)

# The test clock: after every alert in these tests starts (their times are believed).
NOW = 1_795_269_600.0  # 2026-11-21T14:00:00Z


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def alert(
    status: str, fingerprint: str = "fp1", starts: str = "2026-11-21T10:00:00Z", **labels: str
) -> dict:
    return {
        "status": status,
        "labels": {"alertname": "WardenMemoryWatermarkHigh", **labels},
        "annotations": {"summary": "x"},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-21T11:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fingerprint,
    }


def payload(*alerts: dict) -> bytes:
    return json.dumps(webhook_notification(*alerts)).encode()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def controller(clock: Clock, registry: CollectorRegistry) -> Controller:
    return Controller(ControlConfig(), WardenMetrics(registry), clock=clock)


def apply(controller: Controller, *alerts: dict) -> dict[str, int]:
    return controller.apply_alerts(parse_payload(payload(*alerts)))


# --- leases and idempotency ------------------------------------------------------------------


def test_firing_takes_a_lease_and_resolved_releases_it(controller: Controller) -> None:
    assert apply(controller, alert("firing", warden_action="stop_admission")) == {"applied": 1}
    assert controller.policy().stop_admission
    assert apply(controller, alert("resolved", warden_action="stop_admission")) == {"released": 1}
    assert controller.policy() == EffectivePolicy()


def test_duplicates_renew_without_changing_the_outcome(
    controller: Controller, clock: Clock
) -> None:
    firing = alert("firing", warden_action="reject_all", warden_retry_after="30")
    apply(controller, firing)
    clock.now += 200
    assert apply(controller, firing) == {"renewed": 1}
    clock.now += 200  # 400 s after the first, 200 after the renewal: still live (TTL 300)
    assert controller.policy().reject_all
    assert controller.policy().retry_after_s == 30


def test_silence_lets_the_lease_expire(controller: Controller, clock: Clock) -> None:
    apply(controller, alert("firing", warden_action="stop_admission"))
    clock.now += 299
    assert controller.policy().stop_admission
    clock.now += 2
    assert not controller.policy().stop_admission


def test_a_replayed_firing_cannot_undo_a_newer_resolution(controller: Controller) -> None:
    firing = alert("firing", warden_action="stop_admission")
    apply(controller, firing)
    apply(controller, alert("resolved", warden_action="stop_admission"))
    assert apply(controller, firing) == {"stale": 1}  # delivered late or replayed
    assert not controller.policy().stop_admission


def test_reordered_resolution_of_an_old_incarnation_keeps_the_new_lease(
    controller: Controller,
) -> None:
    apply(controller, alert("firing", starts="2026-11-21T12:00:00Z", warden_action="reject_all"))
    old = alert("resolved", starts="2026-11-21T10:00:00Z", warden_action="reject_all")
    assert apply(controller, old) == {"stale": 1}
    assert controller.policy().reject_all


def test_resolution_with_no_lease_is_a_noop(controller: Controller) -> None:
    assert apply(controller, alert("resolved", warden_action="reject_all")) == {"noop": 1}


def test_new_incarnation_after_resolution_applies(controller: Controller) -> None:
    apply(controller, alert("firing", warden_action="stop_admission"))
    apply(controller, alert("resolved", warden_action="stop_admission"))
    later = alert("firing", starts="2026-11-21T13:00:00Z", warden_action="stop_admission")
    assert apply(controller, later) == {"applied": 1}


def test_unknown_actions_and_foreign_alerts_are_ignored(controller: Controller) -> None:
    counts = apply(
        controller,
        alert("firing", fingerprint="a", warden_action="reboot_the_datacenter"),
        alert("firing", fingerprint="b"),
    )
    assert counts == {"unknown_action": 1, "not_for_warden": 1}
    assert controller.policy() == EffectivePolicy()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["firing", "resolved"]), st.integers(0, 5)), max_size=12),
    st.permutations(list(range(12))),
)
def test_any_delivery_order_ends_in_the_state_of_the_newest_event(events, order) -> None:
    """Alertmanager delivers at least once, in any order: the newest incarnation wins."""
    table = LeaseTable()
    request = ActionRequest("stop_admission")
    applied = [events[i] for i in order if i < len(events)]
    for status, hour in applied:
        if status == "firing":
            table.renew("alertmanager", "fp", request, 300, 0.0, started_at=float(hour))
        else:
            table.release("alertmanager", "fp", 0.0, started_at=float(hour))
    if not events:
        return
    newest_start = max(hour for _, hour in events)
    resolved_newest = any(s == "resolved" and h == newest_start for s, h in events)
    assert (table.get("alertmanager", "fp") is not None) == (not resolved_newest)


# --- policy ------------------------------------------------------------------------------------


def test_policy_is_the_most_restrictive_combination(controller: Controller) -> None:
    apply(
        controller,
        alert("firing", fingerprint="a", warden_action="cap_max_tokens", warden_max_tokens="2048"),
        alert("firing", fingerprint="b", warden_action="cap_max_tokens", warden_max_tokens="512"),
        alert(
            "firing",
            fingerprint="c",
            warden_action="circuit_breaker",
            warden_circuit="half_open",
            warden_admit_fraction="0.25",
        ),
        alert(
            "firing",
            fingerprint="d",
            warden_action="shed_low_priority",
            warden_priority_threshold="3",
        ),
        alert("firing", fingerprint="e", warden_action="enforce_eager"),
    )
    policy = controller.policy()
    assert policy.cap_max_tokens == 512
    assert (policy.circuit, policy.admit_fraction) == ("half_open", 0.25)
    assert policy.shed_priority_above == 3
    assert policy.enforce_eager
    apply(
        controller,
        alert("firing", fingerprint="f", warden_action="circuit_breaker", warden_circuit="open"),
    )
    assert controller.policy().circuit == "open"


def test_policy_gauges_follow_the_leases(
    controller: Controller, registry: CollectorRegistry
) -> None:
    apply(controller, alert("firing", warden_action="cap_max_tokens", warden_max_tokens="64"))
    value = registry.get_sample_value
    assert value(catalog.DEGRADATION_ACTIVE.name, {"action": "cap_max_tokens"}) == 64
    assert value(catalog.DEGRADATION_LEASES.name, {"source": "alertmanager"}) == 1
    apply(controller, alert("resolved", warden_action="cap_max_tokens", warden_max_tokens="64"))
    assert value(catalog.DEGRADATION_ACTIVE.name, {"action": "cap_max_tokens"}) == 0


def test_combine_with_no_leases_is_normal() -> None:
    assert combine([]) == EffectivePolicy()
    assert not EffectivePolicy().degraded


# --- payload validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b"not json", "not JSON"),
        (b"[]", "JSON object"),
        (json.dumps({"version": "3", "alerts": []}).encode(), "version"),
        (json.dumps({"version": "4", "alerts": {}}).encode(), "alerts"),
    ],
)
def test_malformed_envelopes_say_where(body: bytes, where: str) -> None:
    with pytest.raises(PayloadError, match=where):
        parse_payload(body)


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({**alert("firing"), "status": "weird"}, "status"),
        ({**alert("firing"), "labels": {"a": 1}}, "labels"),
        ({**alert("firing"), "fingerprint": ""}, "fingerprint"),
        ({**alert("firing"), "startsAt": "yesterday"}, "startsAt"),
        (alert("firing", warden_action="cap_max_tokens"), "warden_max_tokens"),
        (alert("firing", warden_action="cap_max_tokens", warden_max_tokens="-3"), "max_tokens"),
        (alert("firing", warden_action="circuit_breaker", warden_circuit="ajar"), "circuit"),
    ],
)
def test_a_malformed_alert_says_where_and_the_others_still_parse(bad: dict, where: str) -> None:
    good = alert("firing", fingerprint="fp-good", warden_action="stop_admission")
    first, second = parse_payload(payload(bad, good))
    assert first.problem is not None and where in first.problem and "alerts[0]" in first.problem
    assert second.problem is None and second.request is not None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["version", "alerts", "status", "receiver", "groupLabels"]), json_values
    )
)
def test_parser_rejects_garbage_with_payload_error_only(data: dict) -> None:
    with contextlib.suppress(PayloadError):
        parse_payload(json.dumps(data).encode())


def test_nanosecond_timestamps_parse() -> None:
    (event,) = parse_payload(payload(alert("firing", starts="2026-11-21T10:00:00.123456789Z")))
    assert event.starts_at == pytest.approx(1795255200.123456)


def test_action_params_are_validated() -> None:
    assert parse_action("cap_max_tokens", {"max_tokens": 5}).params == {"max_tokens": 5}
    with pytest.raises(ActionError):
        parse_action("cap_max_tokens", {"max_tokens": "many"})
    with pytest.raises(ActionError):
        parse_action("dance", {})


# --- config ------------------------------------------------------------------------------------


def test_invalid_config_is_refused_naming_the_field(tmp_path) -> None:
    path = tmp_path / "warden.yaml"
    path.write_text(
        "leases:\n  ttl_s: -5\nreflex:\n  queue_levels:\n    - {depth: 10, action: x}\n"
    )
    with pytest.raises(ControlConfigError) as info:
        load_config(path)
    assert "leases.ttl_s" in str(info.value)
    assert "reflex.queue_levels.0.action" in str(info.value)
    with pytest.raises(ControlConfigError, match="typo_field"):
        parse_config({"leases": {"typo_field": 1}})
    with pytest.raises(ControlConfigError, match="strictly increasing"):
        parse_config(
            {
                "reflex": {
                    "queue_levels": [
                        {"depth": 5, "action": "reject_all"},
                        {"depth": 5, "action": "stop_admission"},
                    ]
                }
            }
        )


def test_example_config_file_is_valid_and_matches_defaults() -> None:
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "config" / "warden.example.yaml"
    assert load_config(example) == ControlConfig()


# --- admission ---------------------------------------------------------------------------------


def admit(policy: EffectivePolicy, kv: KvState | None = None, **facts) -> object:
    return decide(RequestFacts(**facts), policy, AdmissionSettings(), HalfOpenGate(), kv)


def test_admission_refusals_name_their_reason() -> None:
    assert admit(EffectivePolicy(stop_admission=True)).reason == "stop_admission"
    assert admit(EffectivePolicy(reject_all=True, retry_after_s=9)).retry_after_s == 9
    assert admit(EffectivePolicy(circuit="open", admit_fraction=0.0)).status == 503
    shed = EffectivePolicy(shed_priority_above=0)
    assert admit(shed, priority=5).reason == "shed_low_priority"
    assert admit(shed, priority=0).admit


def test_cap_rewrites_only_larger_requests() -> None:
    policy = EffectivePolicy(cap_max_tokens=64)
    assert admit(policy, max_tokens=500).cap == 64
    assert admit(policy, max_tokens=10).cap is None
    assert admit(policy).cap == 64


def test_half_open_admits_the_fraction() -> None:
    gate = HalfOpenGate()
    policy = EffectivePolicy(circuit="half_open", admit_fraction=0.25)
    results = [decide(RequestFacts(), policy, AdmissionSettings(), gate).admit for _ in range(100)]
    assert sum(results) == 25


def test_a_full_kv_cache_never_refuses_and_a_prompt_that_can_never_fit_is_400() -> None:
    normal = EffectivePolicy()
    full = KvState(total_blocks=10, block_size=32, usage=1.0)
    # vLLM queues a request until blocks free up: a full cache alone is no reason to refuse,
    # and no max_tokens is rewritten behind the client's back.
    assert admit(normal, full, prompt_tokens=40, max_tokens=500) == Decision(True)
    never = admit(normal, full, prompt_tokens=10 * 32, max_tokens=1)
    assert (never.status, never.reason, never.signal, never.value) == (
        400,
        "kv_never_fits",
        "prompt_tokens",
        320,
    )
    assert never.retry_after_headers() == []


def test_lease_refusals_name_the_signal_and_value_behind_the_lease(
    controller: Controller, clock: Clock
) -> None:
    reflex = Reflex(controller.config.reflex, controller, clock=clock)
    reflex(StepSnapshot(watermark=2, watermark_source="device", watermark_value=0.934))
    refused = controller.decide(RequestFacts())
    assert (refused.status, refused.reason) == (503, "stop_admission")
    assert (refused.signal, refused.value) == ("memory_watermark", "critical: device risk 0.934")
    assert "memory_watermark" in refused.message
    assert refused.error_fields() == {
        "warden_reason": "stop_admission",
        "warden_signal": "memory_watermark",
        "warden_value": "critical: device risk 0.934",
    }
    firing = alert("firing", "fp-oom", warden_action="reject_all", warden_retry_after="30")
    firing["annotations"]["description"] = "Memory watermark reached level 3"
    apply(controller, firing)
    by_alert = controller.decide(RequestFacts())
    assert by_alert.reason == "reject_all" and by_alert.signal == "WardenMemoryWatermarkHigh"
    assert by_alert.value == "Memory watermark reached level 3"
    assert by_alert.retry_after_headers() == [
        (b"retry-after", b"30"),
        (b"retry-after-ms", b"30000"),
    ]
    controller.set_manual("ops-1", ActionRequest("shed_low_priority"), 60)
    controller.leases.release("alertmanager", "fp-oom", clock.now)
    controller.leases.release("reflex", "watermark:stop_admission", clock.now)
    shed = controller.decide(RequestFacts(priority=5))
    assert (shed.reason, shed.signal, shed.value) == ("shed_low_priority", "manual", "ops-1")
    leases = {lease["key"]: lease["cause"] for lease in controller.state_json()["leases"]}
    assert leases == {"ops-1": {"signal": "manual", "value": "ops-1"}}


# --- saturation ----------------------------------------------------------------------------


def busy(waiting: int, drain: float | None = 4.0, service: float | None = 2.0) -> SaturationState:
    return SaturationState(
        running=8,
        waiting=waiting,
        drain_rate=drain,
        service_s=service,
        tokens_per_request=96 if drain else None,
    )


def saturation_config(**limits: Any) -> AdmissionSettings:
    return AdmissionSettings(saturation=SaturationSettings(**limits))


def test_saturation_never_refuses_until_a_limit_is_set() -> None:
    decision = decide(
        RequestFacts(prompt_tokens=40),
        EffectivePolicy(),
        AdmissionSettings(),
        HalfOpenGate(),
        KvState(10, 32, 1.0),
        Saturation(busy(waiting=5000), RetrySchedule()),
    )
    assert decision.admit


def test_saturation_refuses_on_predicted_latency_wait_or_depth_naming_the_signal() -> None:
    def judge(state: SaturationState, prompt: int | None = None, **limits: Any) -> Decision:
        return decide(
            RequestFacts(prompt_tokens=prompt),
            EffectivePolicy(),
            saturation_config(**limits),
            HalfOpenGate(),
            KvState(20, 32, 0.75),
            Saturation(state, RetrySchedule()),
        )

    # 8 running, 4 finish per second: a batch lasts 2 s. 7 waiting: this request is in the
    # next batch, a 2 s wait plus 2 s of service = 4 s. 8 waiting: the batch after, 6 s.
    assert judge(busy(7), latency_slo_s=5).admit
    late = judge(busy(8), latency_slo_s=5)
    assert (late.status, late.reason, late.signal, late.value) == (503, "saturated", "latency_s", 6)
    assert "latency SLO of 5 s" in late.message
    waits = judge(busy(12), max_queue_wait_s=3)
    assert (waits.signal, waits.value) == ("queue_wait_s", 4)
    deep = judge(busy(12), max_queue_depth=10)
    assert (deep.signal, deep.value) == ("queue_depth", 12)
    # The KV forecast for the request at hand: 4 blocks free (5 of 20, less a margin of 1), a
    # 300-token prompt needs 10; each finished request frees 3 blocks (96 tokens), so two must
    # finish first: one batch, a 2 s wait, although nothing is queued.
    assert judge(busy(0), prompt=300, max_queue_wait_s=1.9).value == 2.0
    assert judge(busy(0), prompt=300, max_queue_wait_s=2.1).admit
    assert judge(busy(0), prompt=40, max_queue_wait_s=0.1).admit  # fits: no wait
    # An unmeasured drain rate is no reason to refuse: unknown never refuses.
    assert judge(busy(500, drain=None), max_queue_wait_s=1).admit


def test_retry_after_comes_from_the_drain_rate_and_spreads_the_herd() -> None:
    # Slots of one expected completion each (the returns booked at the whole drain): the
    # share below it is test_returns_are_booked_below_the_drain_so_the_queue_shrinks.
    schedule = RetrySchedule(utilisation=1.0)
    settings = saturation_config(max_queue_wait_s=3.0)
    state = busy(waiting=12, drain=4.0)  # two batches of 2 s: a 4 s wait, 1 s over the limit

    def refuse(now: float, state: SaturationState, schedule: RetrySchedule) -> Decision:
        return decide(
            RequestFacts(),
            EffectivePolicy(),
            settings,
            HalfOpenGate(),
            None,
            Saturation(state, schedule, now),
        )

    retries = [refuse(100.0, state, schedule).retry_after_s for _ in range(6)]
    # The first may come back once the queue has drained for 1 s. Told in whole seconds (what
    # most clients read), those refused together come back a second apart, not together.
    assert retries == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    # A refusal half a second later comes back between them: more than one expected
    # completion (1/4 s) from each.
    assert refuse(100.5, state, schedule).retry_after_s == 1.0
    # One a tenth of a second later would come back too near the first and the one above.
    assert refuse(100.1, state, schedule).retry_after_s == 7.0
    # Bounded: a queue hours deep is told at most retry_after_max_s (120 s by default: what
    # the OpenAI SDK vLLM installs honours).
    deep = refuse(0.0, busy(waiting=100_000, drain=1.0), RetrySchedule())
    assert deep.retry_after_s == RETRY_AFTER_MAX_S == 120.0
    assert deep.retry_after_headers() == [
        (b"retry-after", b"120"),
        (b"retry-after-ms", b"120000"),
    ]
    # No whole second within a bound: the bound, or a sub-second bound's earliest time.
    assert RetrySchedule().book(0.0, 3.0, 4.0, 0.5, 2.0) == 2.0
    assert RetrySchedule().book(0.0, 0.0, 4.0, 0.0, 0.5) == 0.5
    assert RetrySchedule().book(0.0, 0.2, 4.0, 0.0, 0.5) == 0.2
    constant = saturation_config(max_queue_wait_s=3.0, retry_after="constant")
    fixed = decide(
        RequestFacts(), EffectivePolicy(), constant, HalfOpenGate(), None, Saturation(state)
    )
    assert fixed.retry_after_s == 5


def test_a_herd_arriving_between_two_steps_is_admitted_only_as_far_as_the_slo_allows(
    registry: CollectorRegistry, clock: Clock
) -> None:
    # One batch (8 running) lasts 1 s; the SLO is 2.5 s. The last step saw an idle queue;
    # 24 requests then arrive before the next one, each admitted one held in flight.
    config = ControlConfig(admission=saturation_config(latency_slo_s=2.5))
    controller = Controller(config, WardenMetrics(registry), clock=clock)
    controller.engine_client = SimulatedEngineClient(8)
    controller.saturation = SaturationState(
        running=0, waiting=0, drain_rate=8.0, service_s=1.0, tokens_per_request=96
    )
    with contextlib.ExitStack() as in_flight:
        admitted = []
        for _ in range(24):
            decision = controller.decide(RequestFacts(prompt_tokens=40))
            admitted.append(decision.admit)
            if decision.admit:
                in_flight.enter_context(controller.serving())
        # 8 fill the batch; the next 8 wait one batch (1 s + 1 s of service); the 17th would
        # wait two (3 s): it and the rest are refused, each naming its predicted latency.
        assert admitted == [True] * 16 + [False] * 8
        assert controller.admitted_in_flight == 16
        # The 8 refused hold their places behind the 8 queued until they are due back.
        live = controller.live_saturation()
        assert (live.running, live.waiting, live.capacity) == (8, 16, 8)
        refused = controller.decide(RequestFacts())
        assert (refused.signal, refused.value) == ("latency_s", 4.0)
        # The state shows the drain rate the refusal's return was spaced by: the engine's.
        shown = controller.saturation_json()["in_flight"]["booking_drain_rate_per_s"]
        assert shown == pytest.approx(8.0)
        assert (controller.live_saturation(held=False).waiting) == 8
    assert controller.admitted_in_flight == 0
    clock.now += 60  # every booking has expired: no place is held any more
    # vLLM's own unfinished count is read too (requests another path handed to the engine).
    controller.engine_client = SimulatedEngineClient(8, unfinished=16)
    assert controller.live_saturation().waiting == 8
    # With 7 in flight there is a free slot: no wait at all, whatever the last step said.
    controller.engine_client = SimulatedEngineClient(8, unfinished=7)
    controller.saturation = SaturationState(
        running=8, waiting=0, drain_rate=8.0, service_s=1.0, tokens_per_request=96
    )
    assert controller.live_saturation().running == 7
    assert controller.decide(RequestFacts()).admit


def test_returns_booked_behind_the_places_held_come_back_at_the_drain_booked_for_them(
    registry: CollectorRegistry, clock: Clock
) -> None:
    """An overload at twice what the engine drains: 16 in flight (a full batch of 8 and 8
    queued, a batch a second), then 160 refused over 10 s. Each refusal's earliest return is
    judged on the engine's own queue and booked behind the places held, each second of the
    clock holding the returns of the share of the drain booked for them
    (``RETURN_UTILISATION``), to the nearest whole return: the last comes back 160 / 8 s
    after the first, neither sooner nor later. Judged
    behind the places held as well, each return went as far again beyond them as the queue
    they made (the last 30 s out: run 69's engine idle for 100 s while its returns trickled
    in). The deep slots' calibration at 1.8 is what made that queue long."""
    config = ControlConfig(admission=saturation_config(latency_slo_s=2.5))
    controller = Controller(config, WardenMetrics(registry), clock=clock)
    controller.engine_client = SimulatedEngineClient(8)
    controller.saturation = SaturationState(
        running=8, waiting=0, drain_rate=8.0, service_s=1.0, tokens_per_request=96
    )
    start = clock.now
    with contextlib.ExitStack() as in_flight:
        for _ in range(16):
            assert controller.decide(RequestFacts(prompt_tokens=40)).admit
            in_flight.enter_context(controller.serving())
        # The deep slots have run 1.8x their forecast: a new arrival's latency is judged so.
        for _ in range(DEEP_MIN_SAMPLES):
            controller.deep_slots.observe(DeepAdmission(1.0), 1.8)
        assert controller.deep_slots.factor() == pytest.approx(1.8)
        due = []
        for _ in range(160):
            refused = controller.decide(RequestFacts(prompt_tokens=40))
            assert not refused.admit and refused.retry_after_s is not None
            due.append(clock.now + refused.retry_after_s)
            clock.now += 1 / 16
    per_second = Counter(math.floor(at - start) for at in due)
    # The whole returns booked in each second of the clock (start is on one).
    booked = round(8 * RETURN_UTILISATION)
    assert max(per_second.values()) == booked, per_second
    # The first can come back in 3 s (the engine's own queue: 8 ahead, 2 s of wait and
    # service, 1.8x, over the SLO of 2.5 s by 2.9 s); the rest at that rate behind it.
    assert min(due) - start == 3.0
    # The last second or two hold fewer: refused 1/16 s apart, the returns left to book find
    # the places half a completion from the others taken (a burst is not sent back as one).
    assert 3 + 160 / booked - 1 < max(due) - start <= 3 + 160 / booked + 2, max(due) - start


def test_retry_schedule_holds_each_place_until_its_client_is_due_back() -> None:
    schedule = RetrySchedule(grace_s=1.0)
    first = schedule.book(10.0, 0.5, 8.0, 0.5, 30.0)
    second = schedule.book(10.3, 0.5, 8.0, 0.5, 30.0)
    assert (first, second) == (1.0, 1.0)  # whole seconds, due at 11.0 and 11.3
    assert schedule.held(10.4) == 2 and not schedule.due(10.4)
    assert not schedule.claim(10.4)  # an arrival before any is due takes no place
    assert schedule.due(11.0) and schedule.claim(11.0)  # the first client is back
    assert schedule.held(11.0) == 1
    # The second comes back and is refused again: rebooked, not held twice.
    schedule.book(11.3, 0.5, 8.0, 0.5, 30.0)
    assert schedule.held(11.3) == 1
    # A client that never comes back holds its place only until the grace after its due time.
    assert schedule.held(13.2) == 1 and schedule.held(13.4) == 0
    # A flood holds a bounded number of places; the rest are still told when to come back.
    bounded = RetrySchedule(max_held=3)
    retries = [bounded.book(0.0, 1.0, 8.0, 0.5, 30.0) for _ in range(5)]
    assert bounded.held(0.0) == 3 and retries == [1.0, 2.0, 3.0, 4.0, 4.0]


def test_a_booked_request_is_known_by_its_key_and_places_of_clients_who_never_return_lapse() -> (
    None
):
    schedule = RetrySchedule(grace_s=1.0, window=4, utilisation=1.0)
    # Before any booking has ended, every client is expected back.
    assert schedule.book(0.0, 1.0, 4.0, 0.5, 30.0, request_key=11) == 1.0
    assert schedule.book(0.0, 1.0, 4.0, 0.5, 30.0, request_key=12) == 2.0
    assert schedule.return_share(0.0) == 1.0 and schedule.expected_returns(0.0) == 2
    # A return is told by its key, early or late, whatever arrived in between; a new request
    # (another key) is not a return even when a booking is due.
    assert schedule.is_return(0.1, 12) and not schedule.is_return(1.1, 99)
    assert schedule.claim(1.3, request_key=12) and not schedule.claim(1.3, request_key=12)
    assert schedule.held(1.3) == 1 and schedule.is_return(1.3, 11)
    # 11 never comes back: its place lapses one grace after it was due.
    assert schedule.held(2.1) == 0 and not schedule.is_return(2.1, 11)
    assert schedule.return_share(2.1) == 0.5
    # Two more that never come back: three of the last four bookings lapsed.
    schedule.book(3.0, 1.0, 4.0, 0.5, 30.0, request_key=21)
    schedule.book(3.0, 1.0, 4.0, 0.5, 30.0, request_key=22)
    assert schedule.held(10.0) == 0 and schedule.return_share(10.0) == 0.25
    # Now each booking keeps only a quarter of a completion (1/16 s) around its return:
    # refused 0.07 s apart, each comes back a second later. A quarter of the places held are
    # what a new arrival queues behind.
    retries = [
        schedule.book(10.0 + 0.07 * i, 1.0, 4.0, 0.5, 30.0, request_key=30 + i) for i in range(8)
    ]
    assert retries == [1.0] * 8
    assert schedule.held(10.5) == 8 and schedule.expected_returns(10.5) == 2
    # Where every client comes back, each takes a whole completion (1/4 s of its second):
    # the same refusals come back in whole seconds, four to a second, none within half a
    # completion (1/8 s) of another.
    at_one = RetrySchedule(utilisation=1.0)
    spread = [at_one.book(10.0 + 0.07 * i, 1.0, 4.0, 0.5, 30.0) for i in range(8)]
    assert spread == [1.0, 2.0] * 4
    back = sorted(10.0 + 0.07 * i + wait for i, wait in enumerate(spread))
    assert Counter(math.floor(at) for at in back) == {11: 4, 12: 4}
    assert min(later - earlier for earlier, later in itertools.pairwise(back)) >= 0.125
    # A client back and refused again is rebooked, not held twice, and counted as a return
    # (the window of four now holds three lapses and this return).
    schedule.book(10.5, 1.0, 4.0, 0.5, 30.0, request_key=30)
    schedule.book(10.5, 1.0, 4.0, 0.5, 30.0, request_key=31)
    assert schedule.held(10.5) == 8 and schedule.return_share(10.5) == 0.5
    # A request without a key (a route whose body warden does not read) takes the earliest
    # booking due, keyed or not; the keyed client then finds none left to take.
    assert schedule.claim(11.2) and not schedule.is_return(11.2, 32)
    assert not schedule.claim(11.2, request_key=32) and schedule.held(11.2) == 7


def saturated_controller(registry: CollectorRegistry, clock: Clock) -> Controller:
    """One batch of 8 lasts 1 s, the SLO is 2.5 s, and 16 are in flight (8 running, 8 queued):
    a new request would wait two batches (3 s)."""
    controller = Controller(
        ControlConfig(admission=saturation_config(latency_slo_s=2.5)),
        WardenMetrics(registry),
        clock=clock,
    )
    controller.engine_client = SimulatedEngineClient(8, unfinished=16)
    controller.saturation = SaturationState(
        running=8, waiting=8, drain_rate=8.0, service_s=1.0, tokens_per_request=96
    )
    return controller


def test_clients_that_never_return_stop_holding_the_batch_from_filling(
    registry: CollectorRegistry, clock: Clock
) -> None:
    # A batch of 8 lasts 1 s and the SLO is 2.5 s: with 8 queued, one more waits two batches.
    controller = saturated_controller(registry, clock)
    refused = [controller.decide(RequestFacts(request_key=k)) for k in range(40)]
    assert not any(decision.admit for decision in refused)
    # None of the 40 comes back: their places lapse, and so does the trust in places held.
    clock.now += 60
    assert controller.retry_schedule.return_share(clock.now) == 0.0
    flood = [controller.decide(RequestFacts(request_key=k)) for k in range(100, 120)]
    assert not any(decision.admit for decision in flood)
    assert controller.retry_schedule.held(clock.now) == 20
    # One request finishes: a new arrival finding 7 queued is judged on the engine's queue
    # alone (one batch of wait) and admitted, not behind 20 places nobody comes back for.
    controller.engine_client = SimulatedEngineClient(8, unfinished=15)
    controller.saturation = dataclasses.replace(controller.saturation, waiting=7)
    assert controller.live_saturation().waiting == 7
    assert controller.decide(RequestFacts(request_key=500)).admit
    # A client that does come back is still judged without the places behind it.
    clock.now += 0.1
    assert controller.retry_schedule.is_return(clock.now, 100)
    with controller.serving(request_key=100):
        assert controller.retry_schedule.held(clock.now) == 19
    assert controller.saturation_json()["in_flight"]["return_share"] > 0.0


def test_admitted_requests_are_counted_within_or_over_the_slo_they_were_admitted_on(
    registry: CollectorRegistry, clock: Clock
) -> None:
    within, missed = catalog.SLO_OUTCOMES
    name = catalog.ADMITTED_SLO.name

    def counted() -> tuple[float | None, float | None]:
        return (
            value(registry, name, outcome=within),
            value(registry, name, outcome=missed),
        )

    controller = Controller(
        ControlConfig(admission=saturation_config(latency_slo_s=2.0)),
        WardenMetrics(registry),
        clock=clock,
    )
    assert counted() == (0.0, 0.0)  # exported from the start
    with controller.serving():
        clock.now += 2.0  # answered at the SLO: kept
    with controller.serving():
        clock.now += 2.5
    assert counted() == (1.0, 1.0)


def test_deep_slot_admissions_teach_admission_how_late_they_ran(
    registry: CollectorRegistry, clock: Clock
) -> None:
    controller = Controller(
        ControlConfig(admission=saturation_config(latency_slo_s=2.0)),
        WardenMetrics(registry),
        clock=clock,
    )
    assert controller._saturation().deep_factor == 1.0
    # Requests admitted into deep slots on a forecast of 1.6 s, each answered in 1.9 s; and
    # requests admitted elsewhere (no deep forecast), however late, teach it nothing.
    for _ in range(20):
        with controller.serving():
            clock.now += 5.0
    for _ in range(DeepSlotCalibration().min_samples):
        with controller.serving(deep=DeepAdmission(1.6, pace_margin=1.1, slot=5)):
            clock.now += 1.9
    factor = controller._saturation().deep_factor
    assert factor == pytest.approx(1.9 / 1.6)
    shown = controller.saturation_json()["deep_slots"]
    assert (shown["factor"], shown["samples"]) == (round(factor, 3), 16)
    assert shown["recent"][0] == {
        "ended_s_ago": 0.0,
        "slot": 5,
        "forecast_s": 1.6,
        "deep_factor": 1.0,
        "pace_margin": 1.1,
        "allowed_s": 1.76,
        "latency_s": 1.9,
    }


def test_the_state_shows_the_pace_margin_admission_judges_deep_slots_with(
    registry: CollectorRegistry, clock: Clock
) -> None:
    """The meter does not know the batch's size limit, admission does: ``/warden/state``
    shows the pace margin at it, with the window changes it went on (at none, it read 1.0
    and 0 whatever the engine did: run 56's deep admissions could not be told apart)."""
    controller = Controller(
        ControlConfig(admission=saturation_config(latency_slo_s=2.0)),
        WardenMetrics(registry),
        clock=clock,
    )
    meter = SaturationMeter()
    now = 100.0
    meter.observe(now, 8, 4, [])
    for pace_ms in ([10.0] * 8 + [15.0, 15.0]) * 3:  # a second of steps at each pace
        end = now + 1.0
        while now + pace_ms / 1000 <= end + 1e-9:
            now += pace_ms / 1000
            meter.observe(now, 8, 4, [])
        now = end
    controller.saturation = SaturationState(
        running=8, waiting=4, pace_record=meter.pace, measured_at=now + 0.5
    )
    assert controller.saturation.capacity is None
    unknown = controller.saturation_json()["measured"]
    assert (unknown["pace_margin"], unknown["pace_changes"]) == (1.0, 0)
    controller.engine_client = SimulatedEngineClient(8)
    measured = controller.saturation_json()["measured"]
    assert measured["capacity"] == 8
    assert measured["pace_changes"] >= PACE_MIN_CHANGES
    assert measured["pace_margin"] == pytest.approx(1.5, rel=0.02)


def test_requests_offered_faster_than_the_engine_drains_them_are_an_overload(
    registry: CollectorRegistry, clock: Clock
) -> None:
    """Every request admission judges is offered load, refused ones too: set against what
    the engine drains at a full batch (8 a second here), 20 offered in two seconds is a
    light load, 80 an overload, which ``/warden/state`` shows as admission sees it (it
    floors a deep slot's pace margin at an overload's onset), each count less its Poisson
    deviation. Without a saturation limit nothing is counted."""
    controller = saturated_controller(registry, clock)
    assert controller.live_saturation().offered_per_s == 0.0
    clock.now = 1000.0
    for _ in range(20):
        controller.decide(RequestFacts())
        clock.now += 2.0 / 20
    light = controller.live_saturation()
    # The window's whole buckets and the current one hold 17 of them, over 1.75 s.
    assert light.offered_per_s == pytest.approx(sure_count(17) / 1.75, rel=0.02)
    assert not light.overloaded and light.keeps_up
    for _ in range(80):
        controller.decide(RequestFacts())
        clock.now += 1.0 / 40
    overload = controller.live_saturation()
    assert overload.offered_per_s == pytest.approx(sure_count(80) / 2, rel=0.05)
    assert overload.overloaded
    shown = controller.saturation_json()["measured"]
    assert shown["overloaded"] is True
    assert shown["offered_per_s"] == pytest.approx(sure_count(80) / 2, rel=0.05)
    # Two quiet seconds later the window holds none of them.
    clock.now += OFFERED_WINDOW_S + 0.1
    assert controller.live_saturation().offered_per_s == 0.0
    unlimited = Controller(ControlConfig(), WardenMetrics(CollectorRegistry()), clock=clock)
    unlimited.engine_client = SimulatedEngineClient(8, unfinished=16)
    unlimited.decide(RequestFacts())
    assert unlimited.live_saturation().offered_per_s is None
    assert unlimited.offered.rate(clock.now) == 0.0


def test_an_overload_shows_within_its_first_second_and_a_burst_at_once_does_not(
    registry: CollectorRegistry, clock: Clock
) -> None:
    """After a quiet spell, requests offered at 20 a second where a full batch drains 8 read
    as an overload 0.8 s in (the last second's rate, 15 a second less its chance): read over
    two seconds alone they were 8.9 a second, a light load, until 1.5 s in, and the deep
    slots admitted in the overload's first second went unfloored (issue #28, run 61). A full
    batch's worth offered at once reads as at most its size over three quarters of a second,
    less its chance: not an overload, and the engine keeps up (quick check 65: a 0.5x load's
    bunches, read as counted, were 1.3x the drain)."""
    controller = saturated_controller(registry, clock)
    clock.now = 2000.0
    for _ in range(16):
        controller.decide(RequestFacts())
        clock.now += 1.0 / 20
    onset = controller.live_saturation()
    assert onset.offered_per_s == pytest.approx(sure_count(16) / 0.8, rel=0.05)
    assert onset.overloaded
    clock.now = 3000.1
    for _ in range(8):
        controller.decide(RequestFacts())
    burst = controller.live_saturation()
    assert burst.offered_per_s == pytest.approx(sure_count(8) / 0.85, rel=0.05)
    assert not burst.overloaded and burst.keeps_up


def test_a_client_that_honours_retry_after_is_not_overtaken_by_a_later_arrival(
    registry: CollectorRegistry, clock: Clock
) -> None:
    # One batch of 8 lasts 1 s, the SLO is 2.5 s, and 16 are in flight: a new request would
    # wait two batches (3 s). A is refused and told to come back once one batch is done, in
    # the whole second a client reads.
    controller = saturated_controller(registry, clock)
    told = controller.decide(RequestFacts())
    assert not told.admit and told.retry_after_s == 1.0
    # One request finishes: 15 in flight. B arrives first; without A's place it would be
    # admitted (7 queued: one batch of wait) and A, back on time, refused again.
    clock.now += 0.2
    controller.engine_client = SimulatedEngineClient(8, unfinished=15)
    controller.saturation = dataclasses.replace(controller.saturation, waiting=7)
    later = controller.decide(RequestFacts())
    assert (later.admit, later.signal) == (False, "latency_s")
    clock.now += 0.81  # A is back, just after its due time
    back = controller.decide(RequestFacts())
    assert back.admit
    with controller.serving():  # admitted: it takes the place held for it
        assert controller.retry_schedule.held(clock.now) == 1  # B's, booked behind it


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_saturation_state_is_held_and_crossings_are_timed_to_the_first_refusal(
    registry: CollectorRegistry, clock: Clock
) -> None:
    config = ControlConfig(admission=saturation_config(max_queue_wait_s=2.0))
    controller = Controller(config, WardenMetrics(registry), clock=clock)
    monitor = StepMonitor(WardenSettings(), WardenMetrics(registry), None, clock=clock)
    monitor.add_listener(SaturationWatch(config.admission.saturation, controller, clock=clock))
    # Ten requests finish in 2.5 s (4 per busy second), nothing waits yet.
    for _ in range(10):
        clock.now += 0.25
        monitor.on_step(running=8, waiting=0, kv_usage=0.9, finished=[(96, 0.0, 2.0)])
    assert controller.decide(RequestFacts()).admit
    assert value(registry, catalog.SATURATED.name) == 0
    clock.now += 0.25
    monitor.on_step(running=8, waiting=20, kv_usage=1.0)  # a burst queues up: a 5 s wait
    crossed = clock.now
    assert value(registry, catalog.SATURATED.name) == 1
    clock.now += 0.05
    refused = controller.decide(RequestFacts())
    assert refused.reason == "saturated" and refused.signal == "queue_wait_s"
    controller.record_rejection(refused)
    state = controller.state_json()
    reaction = state["reactions"][-1]
    assert reaction["kind"] == "saturation" and reaction["crossed_at"] == crossed
    assert reaction["reaction_s"] == pytest.approx(0.05)
    assert reaction["first_refusal"] == "saturated"
    rejection = state["recent_rejections"][-1]
    assert rejection["signal"] == "queue_wait_s" and rejection["value"] > 2.0
    # It keeps what the forecast was made of: the wait it named, the batch and the queue.
    assert rejection["basis"] == {"wait_s": rejection["value"], "running": 8, "waiting": 20}
    # The queue drains: saturated is held for hold_s (20 s), then normal; one change each way.
    for _ in range(100):
        clock.now += 0.25
        monitor.on_step(running=8, waiting=0, kv_usage=0.8, finished=[(96, 0.0, 2.0)])
    assert value(registry, catalog.SATURATED.name) == 0
    changes = controller.state_json()["saturation"]["changes"]
    assert [c["state"] for c in changes] == ["saturated", "normal"]
    assert changes[1]["at"] - crossed >= 20
    assert value(registry, catalog.SATURATION_TRANSITIONS.name, to="saturated") == 1


def test_saturation_meter_measures_busy_time_only() -> None:
    meter = SaturationMeter(keep=8, min_finished=3)
    now = 0.0
    assert meter.observe(now, 1, 0, []).drain_rate is None
    for _ in range(4):
        now += 0.5
        state = meter.observe(now, 2, 3, [(64, 0.1, 1.0)], preempted=1)
    assert state.drain_rate == pytest.approx(2.0)
    assert state.recompute_ratio == 1.0 and state.preemptions_per_s == pytest.approx(2.0)
    now += 0.5
    meter.observe(now, 0, 0, [(64, 0.1, 1.0)])  # idle after this step
    now += 3600  # a night without work does not dilute the rate
    state = meter.observe(now, 1, 5, [])
    assert state.drain_rate == pytest.approx(2.0)
    # Five wait behind a batch of one: this request is the sixth slot to free, at 2 per second
    # (the prediction admission decides on, counted in whole batches).
    assert state.queue_wait_s == pytest.approx(3.0)
    now += 10  # busy and nothing finishes: the rate decays, the predicted wait grows
    state = meter.observe(now, 1, 5, [])
    assert state.drain_rate is not None and state.drain_rate < 0.5


def test_a_burst_at_half_load_is_judged_on_the_full_batchs_drain_rate() -> None:
    """Measured at half load (4 of 8 slots running, each request served in 1 s), the engine
    drains 4 requests/s; a burst that fills the batch drains 8/s. Judged on the half-load rate,
    a request behind the burst was forecast to wait twice too long, and refused at 0.5x with a
    latency SLO (issue #28)."""
    meter = SaturationMeter(keep=32, min_finished=3)
    now = 0.0
    state = meter.observe(now, 4, 0, [])
    for _ in range(40):
        now += 0.25
        state = meter.observe(now, 4, 0, [(96, 0.0, 1.0)])
    assert state.drain_rate == pytest.approx(4.0)
    assert state.slot_rate == pytest.approx(1.0)
    burst = with_live_queue(state, in_flight=9, capacity=8)
    assert burst.running == 8 and burst.waiting == 1
    # The ninth request waits for the batch ahead at 8 per second (1 s), not 4 (2 s).
    assert burst.queue_wait_s == pytest.approx(1.0)
    # A latency SLO of 2.5 s admits it (1 s waiting + 1 s served); at the half-load rate the
    # forecast was 3 s, over the SLO.
    assert breach(SaturationSettings(latency_slo_s=2.5), burst) is None
    half_rate = dataclasses.replace(burst, slot_rate=None)
    assert half_rate.queue_wait_s == pytest.approx(2.0)
    assert breach(SaturationSettings(latency_slo_s=2.5), half_rate) is not None


def test_an_idle_engine_admits_whatever_its_last_requests_took() -> None:
    """The recent service time (5 s, over an SLO of 1 s) would refuse every request; on an idle
    engine nothing then finishes to correct it, and the engine stayed idle for good."""
    slo = SaturationSettings(latency_slo_s=1.0)
    idle = SaturationState(running=0, waiting=0, drain_rate=2.0, service_s=5.0, capacity=8)
    assert breach(slo, idle) is None
    found = breach(slo, dataclasses.replace(idle, running=1))
    assert found is not None and found.signal == "latency_s" and found.value == 5.0


def test_a_client_that_waits_the_whole_second_retry_after_keeps_its_place() -> None:
    """The queue is back under the limit in 1.2 s: the client is told 2 s, the whole second it
    reads, and its place is held for then. Its request then takes a moment to reach admission
    on a loaded server. Back 1.5 s after its place was due, it is still that client's return
    (with a grace of 1 s it was a new arrival, and lost its place)."""
    schedule = RetrySchedule()
    retry = schedule.book(0.0, 1.2, None, 0.5, 30.0, request_key=7)
    assert retry == 2.0
    assert schedule.is_return(retry + 1.5, 7)
    assert schedule.claim(retry + 1.5, 7) and schedule.lapsed == 0


def test_returns_booked_for_an_overload_come_back_at_the_drain_booked_for_them() -> None:
    """20 s of refusals at 30 a second (Poisson, seeded), on an engine that drains 10, all
    of it booked for returns (``RETURN_UTILISATION``): each return takes 1/10 s of its
    second of the clock, so they come back at that rate while the schedule is full, never
    faster in any second, none within 1/20 s of another, and all within the time it needs
    for them. Kept a whole completion from each other instead, returns booked at the
    refusals' random moments filled it to 0.62-0.75 of the rate (run 67)."""
    rng = random.Random(28)
    schedule = RetrySchedule(max_held=100_000)
    booked = 10.0 * RETURN_UTILISATION
    now, returns = 0.0, []
    while now < 20.0:
        now += rng.expovariate(30.0)
        returns.append(now + schedule.book(now, 1.0, 10.0, 0.5, 600.0))
    returns.sort()
    assert max(Counter(math.floor(at) for at in returns).values()) <= booked
    assert min(later - earlier for earlier, later in itertools.pairwise(returns)) >= 0.5 / booked
    bulk = [at for at in returns if 10.0 <= at < 40.0]
    assert len(bulk) / 30.0 >= 0.95 * booked  # the schedule full: as fast as booked
    # Every refused client is back by about the time the rate booked needs for them all.
    assert returns[-1] <= 1.0 + 1.4 * len(returns) / booked


def test_returns_booked_at_a_drain_read_anew_each_time_come_back_at_the_rate_booked() -> None:
    """The drain each refusal is booked at is read anew from the engine, and moves from one
    to the next (12-21 a second at one 4x overload on this machine). 20 s of refusals at 75
    a second, each booked at a drain drawn between 12 and 21, three in four back on their
    first return: the returns come back at the rate the bookings asked for (each one's
    drain), not faster. Cut into slots at each booking's own spacing, the slots of one did
    not line up with another's and the returns came back at 25-29 a second, the queue they
    made refusing the long requests among them again (issue #28)."""
    rng = random.Random(4)
    schedule = RetrySchedule(max_held=100_000)
    refused = sorted(rng.uniform(0.0, 20.0) for _ in range(1500))
    events = [(at, key) for key, at in enumerate(refused)]
    heapq.heapify(events)
    returns, spacings = [], []
    while events:
        now, key = heapq.heappop(events)
        if schedule.is_return(now, key):
            returns.append(now)
            if rng.random() < 0.75:
                assert schedule.claim(now, key)
                continue
        drain = rng.uniform(12.0, 21.0)
        spacings.append(1 / (drain * RETURN_UTILISATION))
        heapq.heappush(events, (now + schedule.book(now, 0.5, drain, 1.0, 600.0, key), key))
    asked = len(spacings) / sum(spacings)  # returns a second the bookings asked for
    bulk = [at for at in returns if 10.0 <= at < 50.0]
    assert 0.95 * asked <= len(bulk) / 40.0 <= 1.05 * asked, (len(bulk) / 40.0, asked)


def test_the_schedule_counts_returns_and_lapses() -> None:
    schedule = RetrySchedule(grace_s=1.0)
    for key in (1, 2):
        schedule.book(0.0, 2.0, None, 0.5, 30.0, request_key=key)
    assert schedule.is_return(1.0, 1) and not schedule.is_return(1.0, 3)
    assert schedule.claim(2.0, 1)  # key 1 came back
    assert (schedule.returned, schedule.lapsed) == (1, 0)
    assert schedule.held(3.5) == 0  # key 2 never did: due at 2 s, lapsed after 3 s
    assert (schedule.returned, schedule.lapsed) == (1, 1)
    assert schedule.return_share(3.5) == 0.5


def test_service_time_is_the_one_99_in_100_recent_requests_beat() -> None:
    """Admission promises the SLO to each request it admits: a forecast made with a typical
    service time (the 90th percentile here: 1 s) breaks that promise for the slow tenth."""
    meter = SaturationMeter(keep=32, min_finished=3)
    state = meter.observe(0.0, 8, 0, [])
    for index in range(33):
        served = 3.0 if index >= 30 else 1.0
        state = meter.observe(0.1 * (index + 1), 8, 0, [(96, 0.0, served)])
    assert state.service_s == 3.0


# --- reflex ------------------------------------------------------------------------------------


def test_reflex_takes_leases_within_the_step_and_releases_with_hysteresis(
    registry: CollectorRegistry, clock: Clock
) -> None:
    levels = (
        QueueLevel(depth=100, action="cap_max_tokens", max_tokens=2048),
        QueueLevel(depth=800, action="shed_low_priority"),
        QueueLevel(depth=1000, action="reject_all"),
    )
    config = ControlConfig(reflex=ReflexSettings(queue_levels=levels))
    controller = Controller(config, WardenMetrics(registry), clock=clock)
    reflex = Reflex(controller.config.reflex, controller, clock=clock)
    delay = controller.config.reflex.release_delay_s

    def step(watermark: int, waiting: int) -> EffectivePolicy:
        reflex(StepSnapshot(watermark=watermark, waiting=waiting))
        return controller.policy()

    assert step(1, 0) == EffectivePolicy()  # high only warns
    assert step(2, 0).stop_admission  # critical: taken in the same step
    policy = step(0, 120)
    assert policy.stop_admission and policy.cap_max_tokens == 2048  # held for the delay
    clock.now += delay
    assert not step(0, 120).stop_admission
    assert step(0, 95).cap_max_tokens == 2048  # inside the 10 % band: held
    clock.now += delay
    assert step(0, 95).cap_max_tokens == 2048
    assert step(0, 1200).reject_all
    step(0, 850)  # below 1000 * 0.9: reject_all is released after the delay
    clock.now += delay
    policy = step(0, 850)
    assert not policy.reject_all and policy.shed_priority_above == 0
    step(0, 10)
    clock.now += delay
    assert step(0, 10) == EffectivePolicy()
    assert registry.get_sample_value(catalog.REFLEX_ACTIONS.name, {"action": "cap_max_tokens"}) == 1
    assert ReflexSettings().queue_levels == ()  # off by default: queue wait decides instead


def test_reflex_runs_as_a_step_listener(
    controller: Controller, registry: CollectorRegistry, clock: Clock, tmp_path
) -> None:
    board = SignalBoard(str(tmp_path / "board"), create=True)
    settings = WardenSettings(watermark_hold_s=0)
    monitor = StepMonitor(settings, WardenMetrics(registry), board, clock=clock)
    monitor.add_listener(Reflex(controller.config.reflex, controller, clock=clock))
    board.write(0, 0.99, 0.5, clock.now)  # the device is nearly full beyond the plan
    monitor.on_step(running=8, waiting=0, kv_usage=0.99)
    policy = controller.policy()
    assert policy.reject_all and policy.stop_admission  # oom_imminent
    board.write(0, 0.2, 0.2, clock.now)
    monitor.on_step(running=2, waiting=0, kv_usage=0.2)
    clock.now += controller.config.reflex.release_delay_s
    monitor.on_step(running=2, waiting=0, kv_usage=0.2)
    assert controller.policy() == EffectivePolicy()
    # A full KV cache and a long queue with no memory risk: nothing happens.
    monitor.on_step(running=8, waiting=40, kv_usage=1.0)
    assert controller.policy() == EffectivePolicy()


def test_policy_changes_record_when_the_reflex_acted_not_when_a_request_came(
    controller: Controller, clock: Clock
) -> None:
    """The state's policy_changes say when a lease took effect: the step that took it, even
    with no request arriving then to be refused; the crossing's reaction record waits for the
    first refusal it causes."""
    reflex = Reflex(controller.config.reflex, controller, clock=clock)
    clock.now = 1000.0
    reflex(StepSnapshot(watermark=2, waiting=0))  # critical: stop admission
    clock.now = 1003.0
    controller.policy()  # a request arrives later
    changes = controller.state_json()["policy_changes"]
    assert changes[-1] == {"at": 1000.0, "active": ["stop_admission"]}
    reaction = controller.state_json()["reactions"][-1]
    assert reaction["crossed_at"] == 1000.0 and reaction["first_refusal_at"] is None
    controller.record_rejection(controller.decide(RequestFacts()))
    reaction = controller.state_json()["reactions"][-1]
    assert reaction["first_refusal_at"] == 1003.0 and reaction["reaction_s"] == 3.0
    reflex(StepSnapshot(watermark=0, waiting=0))  # pressure gone: the release delay starts
    clock.now += controller.config.reflex.release_delay_s
    reflex(StepSnapshot(watermark=0, waiting=0))
    assert controller.state_json()["policy_changes"][-1] == {"at": clock.now, "active": []}


def test_reflex_leases_lapse_if_steps_stop(controller: Controller, clock: Clock) -> None:
    Reflex(controller.config.reflex, controller)(StepSnapshot(watermark=2))
    clock.now += controller.config.reflex.lease_ttl_s + 1
    assert not controller.policy().stop_admission


# --- retry -------------------------------------------------------------------------------------


def test_only_transient_failures_are_retried() -> None:
    assert classify_failure(200, b"", preempted=True, nonfinite=False) == "warden_preemption"
    assert classify_failure(200, b"", preempted=False, nonfinite=True) == "nonfinite_logits"
    assert classify_failure(500, b"CUDA out of memory", False, False) == "engine_oom"
    assert classify_failure(504, b"", False, False) == "timeout"
    assert classify_failure(400, b"out of memory", False, False) is None
    assert classify_failure(500, b"boom", False, False) is None
    assert classify_failure(200, b"", False, False) is None


def test_backoff_grows_and_is_capped() -> None:
    retry = ControlConfig().retry
    import random

    rng = random.Random(1)
    samples = [backoff_s(retry, 5, rng) for _ in range(200)]
    assert max(samples) <= retry.backoff_max_s
    assert max(backoff_s(retry, 2, rng) for _ in range(200)) <= retry.backoff_base_s


def test_resolved_alerts_are_remembered_for_the_tombstone_ttl_then_forgotten() -> None:
    table = LeaseTable(tombstone_ttl_s=600)
    request = ActionRequest("stop_admission")
    table.renew("alertmanager", "fp", request, 300, now=0.0, started_at=10.0)
    table.release("alertmanager", "fp", now=5.0, started_at=10.0)
    table.expire(now=100.0)
    assert table.renew("alertmanager", "fp", request, 300, 100.0, started_at=10.0) == "stale"
    table.expire(now=700.0)  # past the TTL: the tombstone is pruned (once a minute at most)
    assert table.renew("alertmanager", "fp", request, 300, 700.0, started_at=10.0) == "applied"


# --- the action registry ----------------------------------------------------------------------


def test_every_catalog_action_is_defined_once_in_the_registry() -> None:
    from warden.control.actions import ACTIONS, REGISTRY

    assert [a.name for a in REGISTRY] == list(ACTIONS)
    assert set(ACTIONS) == set(catalog.DEGRADATION_ACTIONS)
    minimal = {"cap_max_tokens": {"max_tokens": "64"}}
    for name in ACTIONS:
        policy = combine([_lease(parse_action(name, minimal.get(name, {})))])
        # In force once held: published, listed, and no longer the default policy.
        assert name in policy.active_actions(), name
        assert policy.degraded


def _lease(request: ActionRequest) -> Any:
    from warden.control.leases import Lease

    return Lease("manual", request.action, request.action, request.params, expires_at=1e12)


def test_the_reflex_may_only_take_actions_the_registry_allows() -> None:
    with pytest.raises(ControlConfigError, match="not an action the reflex can take"):
        parse_config({"reflex": {"queue_levels": [{"depth": 5, "action": "enforce_eager"}]}})
    with pytest.raises(ControlConfigError, match="not an action the reflex can take"):
        parse_config({"reflex": {"high": {"actions": ["circuit_breaker"]}}})
    parse_config({"reflex": {"high": {"actions": ["reject_all"]}}})


def test_every_reflex_action_is_exported_at_zero_before_the_first(
    controller: Controller, registry: CollectorRegistry
) -> None:
    """Born at 0, the first reflex lease shows in increase() and on the interventions panel."""
    assert REFLEX_ACTIONS
    for action in REFLEX_ACTIONS:
        value = registry.get_sample_value(catalog.REFLEX_ACTIONS.name, {"action": action})
        assert value == 0, action
