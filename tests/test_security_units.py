"""Closed by default, in-process: hostile input, the trust rule, caps that only lower, which
routes are admitted, and every bound on warden's state (#15).

Real code throughout; the one stand-in is ``RecordingController``, a Controller whose
``preempt_largest`` records the call instead of aborting requests in an engine this test does
not run (the engine tests preempt for real)."""

from __future__ import annotations

import hashlib
import json
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
from warden.control.admission import HalfOpenGate, RequestFacts, admit, limit
from warden.control.alertmanager import PayloadError, parse_payload
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
def test_alertmanager_payload_parser_raises_payload_errors_only(body: bytes) -> None:
    with pytest.raises(PayloadError):
        parse_payload(body)


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
    assert requested("/invocations", {"messages": [], "max_completion_tokens": 5}) == 5
    assert requested("/invocations", {"prompt": "x"}) == 16
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
    stop = ActionRequest("stop_admission")
    for key in "abc":
        assert table.renew("alertmanager", key, stop, 60, now=0.0) == Outcome.APPLIED
    assert table.renew("alertmanager", "d", stop, 60, now=0.0) == Outcome.LIMITED
    assert table.renew("alertmanager", "a", stop, 60, now=1.0) == Outcome.RENEWED
    assert table.renew("manual", "d", stop, 60, now=0.0) == Outcome.APPLIED
    table.release("alertmanager", "a", now=2.0)
    assert table.renew("alertmanager", "d", stop, 60, now=2.0) == Outcome.APPLIED


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
    now = [1_000_000.0]
    control = RecordingController(lambda: now[0])
    cooldown = control.config.leases.preempt_cooldown_s
    control.apply_alerts(parse_payload(firing("fp-a", "2026-11-21T10:00:00Z")))
    now[0] += 1
    control.apply_alerts(parse_payload(firing("fp-b", "2026-11-21T10:00:01Z")))
    control.set_manual("m", parse_action("stop_admission", {"preempt": 2}), 60)
    assert control.preemptions == [(1, "alert")]  # a new fingerprint is no new licence
    assert {lease.key for lease in control.leases.live(now[0])} == {"fp-a", "fp-b", "m"}
    now[0] += cooldown
    control.apply_alerts(parse_payload(firing("fp-c", "2026-11-21T10:00:02Z")))
    assert control.preemptions == [(1, "alert"), (1, "alert")]


def test_manual_leases_beyond_the_cap_are_refused_without_a_state_change() -> None:
    control = Controller(
        parse_config({"leases": {"max_per_source": 2}}), WardenMetrics(CollectorRegistry())
    )
    stop = ActionRequest("stop_admission")
    assert control.set_manual("a", stop, 60) and control.set_manual("b", stop, 60)
    before = control.leases.version
    assert control.set_manual("c", stop, 60) is None
    assert control.leases.version == before


def test_admit_decides_from_priority_alone() -> None:
    gate = HalfOpenGate()
    shed = EffectivePolicy(shed_priority_above=0)
    assert admit(RequestFacts(priority=PrioritySettings().default), shed, gate).reason == (
        "shed_low_priority"
    )
    assert admit(RequestFacts(priority=0), shed, gate).admit
