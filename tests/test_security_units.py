"""Closed by default, in-process: hostile input, the trust rule, caps that only lower, which
routes are admitted, and every bound on warden's state (#15).

Real code throughout; the one stand-in is ``RecordingController``, a Controller whose
``preempt_largest`` records the call instead of aborting requests in an engine this test does
not run (the engine tests preempt for real)."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporter.metrics import WardenMetrics
from warden.common.jsonbody import MAX_DEPTH, BadRequest, content_length, depth, load_json
from warden.control import token_limits, trust
from warden.control.actions import (
    MAX_LEASE_TTL_S,
    MAX_RETRY_AFTER_S,
    ActionError,
    ActionRequest,
    parse_action,
)
from warden.control.admission import HalfOpenGate, RequestFacts, admit, admit_exempt, limit
from warden.control.alertmanager import Bounds, PayloadError, parse_payload
from warden.control.config import (
    AdmissionSettings,
    ControlConfig,
    ControlConfigError,
    PrioritySettings,
    parse_config,
)
from warden.control.controller import Controller
from warden.control.leases import LeaseTable, Outcome
from warden.control.policy import EffectivePolicy
from warden.engine import identity as engine_identity
from warden.engine import routes

# --- hostile JSON ------------------------------------------------------------------------------


def test_an_integer_past_pythons_digit_limit_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="4300 digits"):
        load_json(b'{"max_tokens": ' + b"9" * 5000 + b"}")


def test_deep_nesting_is_a_bad_request_at_any_depth() -> None:
    for levels in (MAX_DEPTH + 1, 5_000, 200_000):  # under and over the interpreter's limit
        with pytest.raises(BadRequest, match=f"deeper than {MAX_DEPTH}"):
            load_json(b"[" * levels + b"]" * levels)
    assert load_json(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    assert depth({"a": [{"b": 1}]}) == 3 and depth(7) == 0


@pytest.mark.parametrize(
    "body, problem",
    [
        (b"\xff\xfe{", "not UTF-8"),
        (b'{"a": ', "not JSON"),
        (b"", "not JSON"),
        (b'{"a": NaN', "not JSON"),
    ],
)
def test_undecodable_bodies_name_the_problem(body: bytes, problem: str) -> None:
    with pytest.raises(BadRequest, match=problem):
        load_json(body)


@pytest.mark.parametrize("raw", ["²", "-1", "1e3", "0x10", "9" * 19, "", "12 34"])
def test_a_malformed_content_length_is_a_bad_request(raw: str) -> None:
    with pytest.raises(BadRequest, match="not a byte count"):
        content_length(raw)


def test_content_length_reads_plain_byte_counts() -> None:
    assert content_length(" 42 ") == 42 and content_length(None) is None


@pytest.mark.parametrize(
    "body",
    [
        b'{"version": "4", "alerts": [' + b"1" * 5000 + b"]}",
        b'{"version": "4", "alerts": ' + b"[" * 3000 + b"]" * 3000 + b"}",
        json.dumps(
            {
                "version": "4",
                "alerts": [
                    {
                        "status": "firing",
                        "labels": {},
                        "fingerprint": "f",
                        "startsAt": "2026-13-01T00:00:00.123456789Z",  # no 13th month
                    }
                ],
            }
        ).encode(),
        json.dumps(
            {
                "version": "4",
                "alerts": [
                    {"status": "firing", "labels": {}, "fingerprint": "f", "startsAt": "2026-11-21"}
                ],
            }
        ).encode(),
    ],
)
def test_alertmanager_payload_parser_refuses_with_payload_errors_or_per_alert_problems(
    body: bytes,
) -> None:
    try:
        events = parse_payload(body)
    except PayloadError:
        return
    assert events and all(e.problem and "startsAt" in e.problem for e in events)


# --- the trust rule for priority ---------------------------------------------------------------

KEY = "sk-gateway-0123"
TRUSTING = PrioritySettings(
    trusted_networks=("10.0.0.0/8", "::1/128"),  # type: ignore[arg-type]
    trusted_api_key_sha256=(hashlib.sha256(KEY.encode()).hexdigest(),),
)


def test_untrusted_requests_get_the_default_priority_whatever_they_say() -> None:
    assert PrioritySettings().default == 1  # above the default shed threshold (0)
    for header in ("-100", "0", "5", None):
        assert trust.request_priority(header, "192.168.1.9", None, TRUSTING) == 1
        assert trust.request_priority(header, "127.0.0.1", "Bearer other", TRUSTING) == 1
    # Trusted by nobody unless configured:
    assert trust.request_priority("-100", "10.0.0.1", f"Bearer {KEY}", PrioritySettings()) == 1


def test_trusted_addresses_and_api_keys_may_name_a_priority() -> None:
    assert trust.request_priority("-3", "10.1.2.3", None, TRUSTING) == -3
    assert trust.request_priority("7", "::1", None, TRUSTING) == 7
    assert trust.request_priority("2", "192.168.1.9", f"Bearer {KEY}", TRUSTING) == 2
    assert trust.request_priority("2", None, f"bearer  {KEY} ", TRUSTING) == 2
    # A trusted source that names none, or garbage, gets the default.
    assert trust.request_priority(None, "10.1.2.3", None, TRUSTING) == 1
    for garbage in ("high", "1" * 11, "1.5", "", "²"):
        assert trust.request_priority(garbage, "10.1.2.3", None, TRUSTING) == 1
    assert not trust.trusted("not-an-address", None, TRUSTING)


def test_trusted_keys_are_configured_as_digests_only() -> None:
    with pytest.raises(ControlConfigError, match="SHA-256"):
        parse_config({"admission": {"priority": {"trusted_api_key_sha256": [KEY]}}})
    with pytest.raises(ControlConfigError, match="trusted_networks"):
        parse_config({"admission": {"priority": {"trusted_networks": ["10.0.0.300/8"]}}})


# --- caps that only lower, read where vLLM reads ------------------------------------------------


def requested(route: str, body: dict[str, Any]) -> int | None:
    rule = token_limits.limit_for(route, body)
    assert rule is not None
    return rule.requested(body)


def test_each_route_reads_its_limit_in_vllms_precedence() -> None:
    assert requested("/v1/completions", {}) == 16  # vLLM's default, not "unlimited"
    assert requested("/v1/completions", {"max_tokens": None}) == 16
    assert requested("/v1/completions", {"max_tokens": "40"}) == 40  # lax, like pydantic
    assert requested("/v1/chat/completions", {"max_tokens": 3, "max_completion_tokens": 50}) == 50
    assert requested("/v1/chat/completions", {"max_tokens": 3, "max_completion_tokens": None}) == 3
    assert requested("/v1/chat/completions", {}) is None  # up to the context length
    assert requested("/v1/chat/completions/batch", {"max_completion_tokens": 9.0}) == 9
    assert requested("/v1/responses", {"max_output_tokens": 12, "max_tokens": 1}) == 12
    assert requested("/v1/messages", {"max_tokens": 30}) == 30
    assert requested("/cohere/v2/chat", {}) is None
    assert requested("/inference/v1/generate", {"sampling_params": {"max_tokens": 8}}) == 8
    # /invocations: vLLM runs chat or completion, whichever validates; both rules apply.
    assert requested("/invocations", {"messages": [], "max_completion_tokens": 5}) == 16
    assert requested("/invocations", {"messages": [], "max_completion_tokens": 50}) == 50
    assert requested("/invocations", {"prompt": "x"}) is None  # as chat: the context length
    assert requested("/invocations", {"prompt": "x", "max_tokens": 9}) == 9
    for unreadable in ({"max_tokens": "ten"}, {"max_tokens": 1.5}, {"max_tokens": [1]}):
        with pytest.raises(token_limits.Unreadable):
            requested("/v1/completions", unreadable)
    with pytest.raises(token_limits.Unreadable):
        requested("/inference/v1/generate", {"sampling_params": "max_tokens=9"})


def test_a_cap_is_written_where_vllm_reads_it() -> None:
    chat = {"max_tokens": 300, "max_completion_tokens": 500}
    token_limits.CHAT.write_cap(chat, 64)
    assert chat == {"max_tokens": 64, "max_completion_tokens": 64}
    old_style = {"max_tokens": 500}
    token_limits.CHAT.write_cap(old_style, 64)
    assert token_limits.CHAT.requested(old_style) == 64
    generate: dict[str, Any] = {"sampling_params": {"temperature": 0}}
    token_limits.SAMPLING_PARAMS.write_cap(generate, 7)
    assert generate["sampling_params"] == {"temperature": 0, "max_tokens": 7}


def test_a_cap_never_raises_a_limit() -> None:
    capped = EffectivePolicy(cap_max_tokens=100)
    settings = AdmissionSettings()
    default_completion = RequestFacts(max_tokens=requested("/v1/completions", {}))
    assert limit(default_completion, capped, settings).cap is None  # stays vLLM's 16
    assert limit(RequestFacts(max_tokens=16), EffectivePolicy(cap_max_tokens=8), settings).cap == 8
    assert limit(RequestFacts(max_tokens=None), capped, settings).cap == 100
    assert limit(RequestFacts(max_tokens=0), capped, settings).cap is None


def test_token_limit_rules_match_vllms_protocol_classes() -> None:
    # Cohere's request model needs the cohere SDK, which is not installed here; its rule is
    # the same ``max_tokens: int | None = None`` as Anthropic's field, read from its source.
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.openai.chat_completion.protocol import (
        BatchChatCompletionRequest,
        ChatCompletionRequest,
    )
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest

    default = CompletionRequest.model_fields["max_tokens"].default
    assert default == token_limits.COMPLETION_DEFAULT_MAX_TOKENS
    for model, rule in (
        (CompletionRequest, token_limits.COMPLETION),
        (ChatCompletionRequest, token_limits.CHAT),
        (BatchChatCompletionRequest, token_limits.CHAT),
        (ResponsesRequest, token_limits.RESPONSES),
        (AnthropicMessagesRequest, token_limits.MAX_TOKENS),
    ):
        for name in rule.fields:
            assert name in model.model_fields, (model.__name__, name)
        if rule.default is None and model is not AnthropicMessagesRequest:
            assert all(model.model_fields[n].default is None for n in rule.fields), model
    assert "sampling_params" in GenerateRequest.model_fields
    import vllm

    cohere = Path(vllm.__file__).parent / "entrypoints" / "cohere" / "protocol.py"
    assert "    max_tokens: int | None = None\n" in cohere.read_text()


# --- which routes pass admission --------------------------------------------------------------


def scope(path: str, method: str = "POST", root: str = "", kind: str = "http") -> dict:
    return {"type": kind, "method": method, "path": path, "root_path": root, "headers": []}


def test_every_acting_request_is_admitted_unless_allow_listed() -> None:
    for path in ("/v1/completions", "/v1/messages", "/invocations", "/anything/new", "/"):
        assert routes.admitted(scope(path)), path
        assert routes.admitted(scope(path, "PUT")) and routes.admitted(scope(path, "DELETE"))
    assert routes.admitted(scope("/v1/realtime", kind="websocket"))
    for path in ("/health", "/metrics", "/warden/degrade", "/tokenize", "/v1/responses/r1/cancel"):
        assert not routes.admitted(scope(path)), path
    assert not routes.admitted(scope("/v1/completions", "GET"))
    assert not routes.admitted({"type": "lifespan"})


def test_the_root_path_is_removed_the_way_the_router_does() -> None:
    assert routes.admitted(scope("/pfx/v1/completions", root="/pfx"))
    assert routes.admitted(scope("/v1/completions", root="/pfx"))  # served unprefixed too
    assert not routes.admitted(scope("/pfx/health", root="/pfx"))
    # Near misses of an exempt path are admitted, never exempt.
    for path in ("/health/", "/HEALTH", "/health/../v1/completions", "//health", "/pfxhealth"):
        assert routes.admitted(scope(path, root="/pfx")), path


# --- bounded state ----------------------------------------------------------------------------


def test_a_source_holds_at_most_its_share_of_leases() -> None:
    table = LeaseTable(max_per_source=3)
    shed = ActionRequest("shed_low_priority")
    for key in "abc":
        assert table.renew("alertmanager", key, shed, 60, now=0.0) == Outcome.APPLIED
    assert table.renew("alertmanager", "d", shed, 60, now=0.0) == Outcome.LIMITED
    assert table.renew("alertmanager", "a", shed, 60, now=1.0) == Outcome.RENEWED
    assert table.renew("manual", "d", shed, 60, now=0.0) == Outcome.APPLIED
    table.release("alertmanager", "a", now=2.0)
    assert table.renew("alertmanager", "d", shed, 60, now=2.0) == Outcome.APPLIED
    assert table.evictions == 0


def test_tombstones_are_capped_oldest_forgotten_first() -> None:
    table = LeaseTable(max_tombstones=100)
    for index in range(250):
        table.release("alertmanager", f"fp{index}", now=float(index), started_at=1.0)
    assert table.tombstones() == 100
    stop = ActionRequest("stop_admission")
    assert table.renew("alertmanager", "fp249", stop, 60, 300.0, started_at=1.0) == "stale"
    assert table.renew("alertmanager", "fp0", stop, 60, 300.0, started_at=1.0) == "applied"


def test_lease_ttls_and_retry_after_are_bounded_in_minutes() -> None:
    assert MAX_RETRY_AFTER_S <= 600 and MAX_LEASE_TTL_S <= 3600
    with pytest.raises(ActionError, match="must be in 1..600"):
        parse_action("reject_all", {"warden_retry_after": "86400"})
    for section, field, value in (
        ("admission", "retry_after_s", MAX_RETRY_AFTER_S + 1),
        ("leases", "ttl_s", MAX_LEASE_TTL_S + 1),
        ("leases", "max_manual_ttl_s", 7 * 86400),
        ("webhook", "tombstone_ttl_s", 30 * 86400),
        ("leases", "max_per_source", 0),
    ):
        with pytest.raises(ControlConfigError, match=f"{section}.{field}"):
            parse_config({section: {field: value}})
    assert ControlConfig().leases.max_manual_ttl_s <= MAX_LEASE_TTL_S


class RecordingController(Controller):
    """The real Controller; only the abort of engine requests is recorded, not performed."""

    def __init__(self, clock: Any) -> None:
        super().__init__(ControlConfig(), WardenMetrics(CollectorRegistry()), clock=clock)
        self.preemptions: list[tuple[int, str]] = []

    def preempt_largest(self, count: int, reason: str) -> None:
        self.preemptions.append((count, reason))


def firing(fingerprint: str, starts: str) -> bytes:
    alert = {
        "status": "firing",
        "labels": {
            "alertname": "WardenMemoryWatermarkCritical",
            "warden_action": "shed_low_priority",
            "warden_preempt": "1",
        },
        "annotations": {},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fingerprint,
    }
    return json.dumps({"version": "4", "alerts": [alert]}).encode()


def test_preemption_cools_down_across_alerts_and_overrides() -> None:
    now = [NOW]
    control = RecordingController(lambda: now[0])
    cooldown = control.config.leases.preempt_cooldown_s
    control.apply_alerts(parse_payload(firing("fp-a", "2026-11-21T10:00:00Z")))
    now[0] += 1
    control.apply_alerts(parse_payload(firing("fp-b", "2026-11-21T10:00:01Z")))
    control.set_manual("m", parse_action("shed_low_priority", {"preempt": 2}), 60)
    assert control.preemptions == [(1, "alert")]  # a new fingerprint is no new licence
    assert {lease.key for lease in control.leases.live(now[0])} == {"fp-a", "fp-b", "m"}
    now[0] += cooldown
    control.apply_alerts(parse_payload(firing("fp-c", "2026-11-21T10:00:02Z")))
    assert control.preemptions == [(1, "alert"), (1, "alert")]


def test_manual_leases_beyond_the_cap_are_refused_without_a_state_change() -> None:
    control = Controller(
        parse_config({"leases": {"max_per_source": 2}}), WardenMetrics(CollectorRegistry())
    )
    shed = ActionRequest("shed_low_priority")
    assert control.set_manual("a", shed, 60) and control.set_manual("b", shed, 60)
    before = control.leases.version
    assert control.set_manual("c", shed, 60) is None
    assert control.leases.version == before


def test_admit_decides_from_priority_alone() -> None:
    gate = HalfOpenGate()
    shed = EffectivePolicy(shed_priority_above=0)
    assert admit(RequestFacts(priority=PrioritySettings().default), shed, gate).reason == (
        "shed_low_priority"
    )
    assert admit(RequestFacts(priority=0), shed, gate).admit


# --- round two (#33): caps that cannot be escaped ---------------------------------------------

# How a client can spell 300 (or fail to) for vLLM's pydantic models: warden must read each the
# same way vLLM does (checked against vLLM's own request model below).
SPELLINGS: list[Any] = [
    "0" * 5000 + "300",
    " " * 500 + "300" + " " * 500,
    "+300",
    "3_00",
    "300.000",
    300.0,
    True,
    "0x12C",
    "3e2",
    "9" * 5000,
    "３００",
    "",
    [300],
]


@pytest.mark.parametrize("spelling", SPELLINGS, ids=lambda v: repr(v)[:24])
def test_a_limit_is_read_exactly_as_vllms_request_model_reads_it(spelling: Any) -> None:
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    for model, rule, body in (
        (CompletionRequest, token_limits.COMPLETION, {"prompt": "x", "max_tokens": spelling}),
        (
            ChatCompletionRequest,
            token_limits.CHAT,
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": spelling},
        ),
        (CompletionRequest, token_limits.COMPLETION, {"prompt": "x", "n": spelling}),
    ):
        try:
            parsed = model.model_validate(body)
        except ValidationError:
            with pytest.raises(token_limits.Unreadable):
                rule.requested(body), rule.sequences(body)
            continue
        if "n" in body:
            assert rule.sequences(body) == parsed.n, body
        else:
            limit = getattr(parsed, rule.fields[0])
            assert rule.requested(body) == limit, (model.__name__, spelling)


def test_a_cap_bounds_the_total_of_every_sequence() -> None:
    capped = EffectivePolicy(cap_max_tokens=8)
    settings = AdmissionSettings()
    assert limit(RequestFacts(max_tokens=100, sequences=4), capped, settings).cap == 2
    assert limit(RequestFacts(max_tokens=1, sequences=8), capped, settings).cap is None
    too_wide = limit(RequestFacts(max_tokens=1, sequences=4096), capped, settings)
    assert not too_wide.admit and too_wide.status == 429
    assert too_wide.reason == "cap_max_tokens" and "4096 sequences" in too_wide.message
    assert too_wide.retry_after_s > 0
    # Without a cap, nothing changes.
    assert limit(RequestFacts(max_tokens=100, sequences=4096), EffectivePolicy(), settings).admit


def sequences(route: str, body: dict[str, Any]) -> int:
    rule = token_limits.limit_for(route)
    assert rule is not None
    return rule.sequences(body)


def test_sequences_count_choices_prompts_and_conversations() -> None:
    assert sequences("/v1/completions", {"prompt": "x"}) == 1
    assert sequences("/v1/completions", {"prompt": "x", "n": "04"}) == 4
    assert sequences("/v1/completions", {"prompt": ["a", "b", "c"], "n": 2}) == 6
    assert sequences("/v1/completions", {"prompt": [[1, 2], [3]], "best_of": 5}) == 10
    assert sequences("/v1/completions", {"prompt": [1, 2, 3]}) == 1  # one tokenized prompt
    assert sequences("/v1/chat/completions", {"n": None}) == 1
    assert sequences("/v1/chat/completions/batch", {"messages": [[{}], [{}], [{}]]}) == 3
    assert sequences("/inference/v1/generate", {"sampling_params": {"n": 7}}) == 7
    assert sequences("/v1/messages", {"n": 50}) == 1  # vLLM's messages model has no n
    assert sequences("/invocations", {"prompt": ["a", "b"], "n": 3}) == 6
    with pytest.raises(token_limits.Unreadable, match="n:"):
        sequences("/v1/completions", {"n": "many"})


@pytest.mark.parametrize(
    "body",
    [
        {"messages": "not a list", "prompt": "hi"},  # chat refuses it: vLLM runs a completion
        {"messages": [{"role": "user", "content": "x"}], "prompt": "hi"},  # vLLM runs chat
        {"messages": [1], "prompt": "hi", "max_tokens": "0300"},
        {"prompt": "hi", "max_completion_tokens": 300},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 300},
    ],
    ids=["messages-not-a-list", "both-valid", "bad-messages", "prompt-only", "chat-only"],
)
def test_invocations_are_capped_whichever_kind_vllm_runs(body: dict[str, Any]) -> None:
    """vLLM's /invocations runs the first request model that validates (chat, then completion);
    after warden's cap, whichever it is, the limit it applies is within the cap."""
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    rule = token_limits.limit_for("/invocations")
    assert rule is not None
    cap = 8
    decision = limit(
        RequestFacts(max_tokens=rule.requested(body), sequences=rule.sequences(body)),
        EffectivePolicy(cap_max_tokens=cap),
        AdmissionSettings(),
    )
    written = json.loads(json.dumps(body))
    if decision.cap is not None:
        rule.write_cap(written, decision.cap)
    for model, fields in (
        (ChatCompletionRequest, ("max_completion_tokens", "max_tokens")),
        (CompletionRequest, ("max_tokens",)),
    ):
        try:
            parsed = model.model_validate(written)
        except ValidationError:
            continue
        applied = next(v for f in fields if (v := getattr(parsed, f)) is not None)
        assert applied <= cap, (model.__name__, written)
        break
    else:
        pytest.fail(f"vLLM runs neither kind: {written}")


def test_a_cap_reads_a_padded_limit_and_lowers_it() -> None:
    body = {"prompt": "x", "max_tokens": "0" * 10_000 + "300"}
    assert token_limits.COMPLETION.requested(body) == 300
    token_limits.COMPLETION.write_cap(body, 8)
    assert body["max_tokens"] == 8


# --- round two: alerts that cannot be suppressed ------------------------------------------------

NOW = 1_795_269_600.0  # 2026-11-21T14:00:00Z
ISO_NOW = "2026-11-21T14:00:00Z"


def am_alert(
    status: str,
    fingerprint: str = "fp-real",
    starts: str = "2026-11-21T13:00:00Z",
    ends: str | None = None,
    **labels: str,
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": "WardenOOMImminent", "warden_action": "reject_all", **labels},
        "annotations": {"description": "oom in 30s"},
        "startsAt": starts,
        "endsAt": ends or ("0001-01-01T00:00:00Z" if status == "firing" else ISO_NOW),
        "fingerprint": fingerprint,
    }


def notify(*alerts: dict[str, Any]) -> bytes:
    return json.dumps({"version": "4", "alerts": list(alerts)}).encode()


def controller_at(now: float = NOW, **config: Any) -> Controller:
    return Controller(parse_config(config), WardenMetrics(CollectorRegistry()), clock=lambda: now)


@pytest.mark.parametrize(
    "starts",
    ["9999-12-31T23:59:59Z", "0001-01-02T00:00:00Z", "2026-11-21T14:06:00Z"],
    ids=["year-9999", "year-1", "6-min-ahead"],
)
def test_a_resolution_the_clock_cannot_believe_leaves_no_tombstone(starts: str) -> None:
    control = controller_at()
    forged = am_alert("resolved", starts=starts)
    assert control.apply_alerts(parse_payload(notify(forged))) == {"invalid": 1}
    assert control.leases.tombstones() == 0
    # The real firing that follows takes its lease.
    assert control.apply_alerts(parse_payload(notify(am_alert("firing")))) == {"applied": 1}
    assert control.policy().reject_all


def test_times_within_the_stated_skew_are_believed() -> None:
    control = controller_at()
    skew = control.config.webhook.max_clock_skew_s
    assert skew == 300
    ahead = am_alert("firing", starts="2026-11-21T14:04:00Z")  # 4 minutes ahead: a skewed clock
    assert control.apply_alerts(parse_payload(notify(ahead))) == {"applied": 1}
    late_end = am_alert("resolved", fingerprint="f2", ends="2026-11-21T14:10:00Z")
    (event,) = parse_payload(notify(late_end))
    assert control.apply_alerts([event]) == {"invalid": 1}
    backwards = am_alert("resolved", fingerprint="f3", ends="2026-11-21T12:00:00Z")
    assert control.apply_alerts(parse_payload(notify(backwards))) == {"invalid": 1}


def test_a_tombstone_never_outlives_the_firing_it_answers() -> None:
    """A resolution stales replays of the firing it resolved, and nothing newer: the next
    incarnation applies and the tombstone goes with it."""
    control = controller_at()
    first = am_alert("firing", starts="2026-11-21T13:00:00Z")
    control.apply_alerts(parse_payload(notify(first)))
    control.apply_alerts(parse_payload(notify(am_alert("resolved", starts="2026-11-21T13:00:00Z"))))
    assert control.leases.tombstones() == 1
    assert control.apply_alerts(parse_payload(notify(first))) == {"stale": 1}  # a replay
    newer = am_alert("firing", starts="2026-11-21T13:30:00Z")
    assert control.apply_alerts(parse_payload(notify(newer))) == {"applied": 1}
    assert control.leases.tombstones() == 0


# --- round two: bounded webhook input -----------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"fingerprint": "f" * 200_000}, "fingerprint: 200000 characters"),
        (
            {"labels": {"alertname": "x", "warden_action": "reject_all", "v": "x" * 500_000}},
            "labels.v",
        ),
        ({"labels": {"n" * 300: "x", "warden_action": "reject_all"}}, "a name of 300"),
        ({"labels": {f"l{i}": "x" for i in range(65)}}, "65 entries"),
        ({"annotations": {"description": "x" * 20_000}}, "annotations.description"),
        ({"annotations": {f"a{i}": "x" for i in range(65)}}, "65 entries"),
    ],
    ids=["fingerprint", "label-value", "label-name", "labels", "annotation", "annotations"],
)
def test_every_webhook_field_is_bounded(change: dict[str, Any], problem: str) -> None:
    control = controller_at()
    events = parse_payload(notify({**am_alert("firing", fingerprint="big"), **change}))
    assert events[0].problem is not None and problem in events[0].problem
    assert len(events[0].fingerprint) <= 128  # even the preview of a refused one is bounded
    assert control.apply_alerts(events) == {"invalid": 1}
    assert control.leases.live(NOW) == [] and control.leases.tombstones() == 0


def test_alerts_past_the_bound_per_notification_are_refused_each() -> None:
    control = controller_at(webhook={"max_alerts": 3})
    alerts = [am_alert("resolved", fingerprint=f"f{i}") for i in range(5)]
    events = parse_payload(notify(*alerts), Bounds(alerts=control.config.webhook.max_alerts))
    assert [e.problem is None for e in events] == [True, True, True, False, False]
    assert "past 3 alerts" in str(events[4].problem)
    assert control.apply_alerts(events) == {"noop": 3, "invalid": 2}


def test_a_lease_keeps_only_a_few_bounded_labels() -> None:
    control = controller_at()
    labels = {f"extra{i}": "x" * 1024 for i in range(60)}
    big = am_alert("firing", **labels)
    big["annotations"] = {"description": "d" * 16_000}
    control.apply_alerts(parse_payload(notify(big)))
    (lease,) = control.leases.live(NOW)
    assert set(lease.labels) <= {
        "alertname",
        "instance",
        "severity",
        "warden_action",
        "_cause_signal",
        "_cause_value",
    }
    assert sum(len(v) for v in lease.labels.values()) < 400


def test_webhook_state_memory_is_bounded_by_the_bounds() -> None:
    """Fill every lease and tombstone a sender can make, each at its largest: the state stays
    within a few MiB (measured with tracemalloc; docs/security.md states the figure)."""
    import tracemalloc

    control = controller_at()
    bounds = Bounds()
    most = control.config.leases.max_per_source
    tombstones = control.config.webhook.max_tombstones
    fat = {
        f"l{i:03d}" + "n" * 120: "v" * bounds.label_value_chars for i in range(bounds.labels - 2)
    }
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for batch in range(0, tombstones, 1000):
        resolved = [
            am_alert("resolved", fingerprint=f"{i:0128d}") for i in range(batch, batch + 1000)
        ]
        control.apply_alerts(parse_payload(notify(*resolved)))
    firing = [
        am_alert("firing", fingerprint=f"L{i:0127d}", starts=ISO_NOW, **fat) for i in range(most)
    ]
    control.apply_alerts(parse_payload(notify(*firing)))
    del firing, resolved  # the notifications are gone; what the controller keeps is measured
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert control.leases.tombstones() == tombstones and len(control.leases.live(NOW)) == most
    print(f"webhook state at every bound: {held / 2**20:.1f} MiB")
    assert held < 8 * 2**20


# --- round two: partial application ------------------------------------------------------------


def test_one_bad_alert_does_not_drop_the_notification() -> None:
    control = controller_at()
    good = [am_alert("firing", fingerprint=f"g{i}") for i in range(49)]
    bad = {**am_alert("firing", fingerprint="bad"), "startsAt": "not a time"}
    counts = control.apply_alerts(parse_payload(notify(*good[:20], bad, *good[20:])))
    assert counts == {"applied": 49, "invalid": 1}
    assert len(control.leases.live(NOW)) == 49


# --- round two: safety first when full ----------------------------------------------------------


def test_a_protective_action_always_finds_room() -> None:
    table = LeaseTable(max_per_source=3)
    table.renew("alertmanager", "cap", ActionRequest("cap_max_tokens", {"max_tokens": 9}), 60, 0.0)
    table.renew("alertmanager", "shed", ActionRequest("shed_low_priority"), 60, 1.0)
    table.renew("alertmanager", "eager", ActionRequest("enforce_eager"), 60, 2.0)
    assert (
        table.renew(
            "alertmanager", "x", ActionRequest("cap_max_tokens", {"max_tokens": 1}), 60, 3.0
        )
        == Outcome.LIMITED
    )
    assert (
        table.renew("alertmanager", "oom", ActionRequest("reject_all"), 60, 3.0) == Outcome.APPLIED
    )
    assert table.evictions == 1 and table.get("alertmanager", "eager") is None  # least protective
    assert (
        table.renew("alertmanager", "stop", ActionRequest("stop_admission"), 60, 4.0)
        == Outcome.APPLIED
    )
    assert table.get("alertmanager", "cap") is None
    # Full of protective leases: the least protective, least recently renewed one makes room.
    assert (
        table.renew("alertmanager", "oom2", ActionRequest("reject_all"), 60, 5.0) == Outcome.APPLIED
    )
    assert {key for (_s, key) in table.snapshot()} == {"oom", "stop", "oom2"}
    assert table.evictions == 3


def test_a_critical_alert_into_a_full_table_is_applied_and_counted() -> None:
    control = controller_at(leases={"max_per_source": 2})
    for name in ("a", "b"):
        shed = am_alert("firing", fingerprint=name, warden_action="shed_low_priority")
        control.apply_alerts(parse_payload(notify(shed)))
    counts = control.apply_alerts(parse_payload(notify(am_alert("firing", fingerprint="oom"))))
    assert counts == {"applied": 1, "lease_evicted": 1}
    assert control.policy().reject_all


# --- round two: the smaller points --------------------------------------------------------------


def test_a_manual_reject_all_names_manual_not_memory() -> None:
    control = controller_at()
    control.set_manual("maintenance", ActionRequest("reject_all"), 60)
    decision = control.decide(RequestFacts())
    assert not decision.admit and decision.reason == "reject_all"
    assert "(memory)" not in decision.message and "manual: maintenance" in decision.message


def test_working_exempt_routes_are_bounded_and_closed_under_reject_all() -> None:
    for path in ("/tokenize", "/v1/messages/count_tokens", "/v1/completions/render"):
        assert not routes.admitted(scope(path)) and routes.bounded_exempt(scope(path)), path
    for path in ("/health", "/warden/degrade", "/abort_requests", "/v1/completions"):
        assert not routes.bounded_exempt(scope(path)), path
    assert not routes.bounded_exempt(scope("/tokenize", method="GET"))
    control = controller_at()
    assert admit_exempt(control.policy()).admit
    control.set_manual("stop", ActionRequest("stop_admission"), 60)
    assert admit_exempt(control.policy()).admit  # still open: no generation
    control.set_manual("all", ActionRequest("reject_all"), 60)
    refused = admit_exempt(control.policy())
    assert not refused.admit and refused.status == 503 and refused.signal == "manual"


def test_the_supervisor_port_logs_no_traceback_when_a_client_leaves_early(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from warden.supervisor.http import _Server

    server = _Server(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    try:
        for gone in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
            try:
                raise gone
            except ConnectionError:
                server.handle_error(None, ("127.0.0.1", 1))
        assert "Traceback" not in capsys.readouterr().err
        try:
            raise ValueError("a real fault")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert "Traceback" in capsys.readouterr().err  # real faults are still shown
    finally:
        server.server_close()


# --- round two: identity without stalls ---------------------------------------------------------


class SlowResolver:
    """Stands in for the system resolver (the only fake here): every lookup takes ``delay_s``;
    ``mine`` resolves to the address the request reached, every other name to nothing."""

    def __init__(self, delay_s: float, mine: str = "alias-of-me") -> None:
        self.delay_s = delay_s
        self.mine = mine
        self.started: list[tuple[str, float]] = []

    async def addresses(self, host: str) -> frozenset[str]:
        self.started.append((host, time.time()))
        await asyncio.sleep(self.delay_s)
        if host == self.mine:
            return frozenset({"10.0.0.5"})
        raise OSError("no such host")


def identity_request() -> Any:
    return types.SimpleNamespace(scope={"server": ("10.0.0.5", 8000)})


@pytest.fixture
def slow_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowResolver]:
    for name in ("WARDEN_INSTANCE", "WARDEN_NAMESPACE", "WARDEN_CLUSTER"):
        monkeypatch.delenv(name, raising=False)
    engine_identity.reset()
    resolver = SlowResolver(delay_s=1.0)
    monkeypatch.setattr(engine_identity, "system_addresses", resolver.addresses)
    yield resolver
    engine_identity.reset()


def test_identity_lookups_are_concurrent_bounded_and_cached(slow_resolver: SlowResolver) -> None:
    foreign = [
        am_alert("firing", fingerprint=f"f{i}", instance=f"engine-{i}:8000") for i in range(300)
    ]
    own = am_alert("firing", fingerprint="own", instance="127.0.0.1:8000")
    alias = am_alert("firing", fingerprint="alias", instance="alias-of-me:8000")
    events = parse_payload(notify(*foreign, own, alias))
    look = engine_identity.first_look(identity_request(), events)
    assert look.identity.accepts(events[300].labels)  # its own alert: known without a lookup
    assert look.pending is not None and len(look.pending) == 301

    async def resolve_all() -> tuple[Any, float]:
        started = time.monotonic()
        identity = await engine_identity.resolve(look)
        return identity, time.monotonic() - started

    identity, took = asyncio.run(resolve_all())
    # 300 one-second lookups one after another would take 300 s; concurrent, under the total
    # deadline, a few seconds at most (a generous bound for a busy machine).
    assert took < 30, took
    assert len(slow_resolver.started) <= engine_identity.MAX_LOOKUPS
    assert identity.accepts(events[300].labels)


def test_a_lookup_past_the_deadline_does_not_stall_the_notification(
    slow_resolver: SlowResolver,
) -> None:
    slow_resolver.delay_s = 60.0
    events = parse_payload(notify(am_alert("firing", instance="alias-of-me:8000")))
    look = engine_identity.first_look(identity_request(), events)

    async def resolve_within() -> float:
        started = time.monotonic()
        await engine_identity.resolve(look, deadline_s=0.2)
        return time.monotonic() - started

    assert asyncio.run(resolve_within()) < 20


def test_the_webhook_applies_this_engines_own_alerts_before_any_lookup(
    slow_resolver: SlowResolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx
    from fastapi import FastAPI

    from tests.support.asgi import serving
    from warden.engine import runtime, webhook

    control = Controller(ControlConfig(), WardenMetrics(CollectorRegistry()))
    monkeypatch.setenv("WARDEN_WEBHOOK_TOKEN", "own-first-token")
    monkeypatch.delenv("WARDEN_WEBHOOK_TOKEN_FILE", raising=False)
    app = FastAPI()
    runtime.install(app, runtime.EngineRuntime(control, WardenMetrics(CollectorRegistry())))
    app.include_router(webhook.router)
    with serving(app) as url:
        port = url.rsplit(":", 1)[1]
        starts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
        foreign = [
            am_alert("firing", fingerprint=f"f{i}", starts=starts, instance=f"e{i}:{port}")
            for i in range(100)
        ]
        own = am_alert("firing", fingerprint="own", starts=starts, instance=f"127.0.0.1:{port}")
        answer = httpx.post(
            f"{url}/warden/alertmanager",
            content=notify(*foreign, own),
            headers={"Authorization": "Bearer own-first-token", "content-type": "application/json"},
            timeout=60,
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["alerts"] == {"applied": 1, "not_for_this_engine": 100}
    lease = control.leases.get("alertmanager", "own")
    assert lease is not None and slow_resolver.started
    # Applied before the first lookup began.
    assert lease.renewed_at <= min(at for _host, at in slow_resolver.started)


def test_a_notification_of_bad_alerts_cannot_flood_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    control = controller_at()
    bad = [
        {"status": "firing", "fingerprint": f"f{i}\nforged", "labels": {"a\nforged": 1}}
        for i in range(1000)
    ]
    with caplog.at_level("WARNING", logger="warden.control"):
        assert control.apply_alerts(parse_payload(notify(*bad))) == {"invalid": 1000}
    assert len(caplog.records) <= 6
    assert all("\n" not in record.getMessage() for record in caplog.records)
