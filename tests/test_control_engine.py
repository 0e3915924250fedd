"""The closed loop against a real vLLM CPU engine: webhook, leases, admission, reflex, retries.

Everything is real: the engine, its API server with warden's middleware and endpoints, HTTP,
and an OTLP/HTTP receiver for the spans. No fakes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter import catalog
from tests.support.engine import TINY_KV_ARGS, complete, running_engine, sample, scrape
from warden.common.outcomes import COMPLETED, FAILED, REFUSED, OutcomeTally, classify
from warden.common.waiting import wait_until
from warden.control.saturation import CLAIM_GRACE_S
from warden.stack.chaos import find_engine_core
from warden.supervisor.engine import EngineProcess

pytestmark = pytest.mark.engine

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LEASE_TTL_S = 4
LONG_PROMPT = " ".join(["memory watermark cache block engine request"] * 12)


class OtlpReceiver:
    """A real OTLP/HTTP endpoint: decodes the protobuf export requests it receives."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        spans: list[dict] = []
        self.spans = spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                data = self.rfile.read(int(self.headers.get("content-length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(data)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            attributes = {a.key: a.value for a in span.attributes}
                            spans.append({"name": span.name, "attributes": attributes})
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def names(self) -> set[str]:
        return {span["name"] for span in self.spans}


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.server.shutdown()


@pytest.fixture(scope="module")
def engine(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, otlp: OtlpReceiver
) -> Iterator[EngineProcess]:
    run_dir = tmp_path_factory.mktemp("control-engine")
    token_file = run_dir / "token"
    token_file.write_text(TOKEN + "\n")
    config = run_dir / "warden.yaml"
    # The forecast (its own engine below) and saturation (the reflex test's engine) are tested
    # apart; this engine runs without either limiting it.
    # Priority from this test process counts (the trust rule, docs/security.md).
    config.write_text(
        f"leases:\n  ttl_s: {LEASE_TTL_S}\nadmission:\n  forecast:\n    enabled: false\n"
        "  priority:\n    trusted_networks: [127.0.0.1/32]\n"
    )
    env = {
        "WARDEN_TEST_INJECT_NONFINITE": "1",
        "WARDEN_WEBHOOK_TOKEN_FILE": str(token_file),
        "WARDEN_CONFIG": str(config),
        "WARDEN_INSTANCE": "engine:8000",  # the instance the test notifications name
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp.url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    with running_engine(tiny_model, extra_args=TINY_KV_ARGS, env=env, run_dir=run_dir) as eng:
        yield eng


@pytest.fixture(autouse=True)
def clean_policy(engine: EngineProcess) -> Iterator[None]:
    """Each test starts and ends with no manual lease and nothing pending; a reflex lease a
    failed test left behind is waited out, so one failure does not fail the next test too."""
    yield
    httpx.delete(f"{engine.base_url}/warden/degrade?all=1", headers=AUTH, timeout=10)
    with contextlib.suppress(TimeoutError):
        wait_until(
            lambda: not any(lease["source"] == "reflex" for lease in state(engine)["leases"]),
            30,
            0.2,
            "no reflex lease",
        )


def notification(status: str, fingerprint: str, starts: str, **labels: str) -> dict:
    ends = "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-21T23:59:00Z"
    return {
        "version": "4",
        "groupKey": '{}/{warden_action=~".+"}:{alertname="x"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "warden-engine",
        "groupLabels": {"alertname": labels.get("alertname", "WardenTest")},
        "commonLabels": labels,
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": [
            {
                "status": status,
                "labels": {"alertname": "WardenTest", "instance": "engine:8000", **labels},
                "annotations": {"summary": "test"},
                "startsAt": starts,
                "endsAt": ends,
                "generatorURL": "http://127.0.0.1:9090/graph",
                "fingerprint": fingerprint,
            }
        ],
    }


def post_alert(engine: EngineProcess, body: dict) -> httpx.Response:
    return httpx.post(f"{engine.base_url}/warden/alertmanager", json=body, headers=AUTH, timeout=10)


def state(engine: EngineProcess) -> dict:
    return httpx.get(f"{engine.base_url}/warden/state", timeout=10).json()


def model(engine: EngineProcess) -> str:
    return str(engine.spec.model)


def test_webhook_firing_rejects_until_resolved(engine: EngineProcess) -> None:
    firing = notification(
        "firing",
        "fp-reject",
        "2026-11-21T10:00:00Z",
        warden_action="reject_all",
        warden_retry_after="7",
    )
    assert post_alert(engine, firing).status_code == 200
    refused = complete(engine, model(engine), "hello")
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "7"
    assert refused.json()["error"]["warden_reason"] == "reject_all"
    # Health, metrics and warden endpoints are never blocked.
    assert httpx.get(f"{engine.base_url}/health").status_code == 200
    assert httpx.get(engine.metrics_url).status_code == 200
    resolved = notification(
        "resolved",
        "fp-reject",
        "2026-11-21T10:00:00Z",
        warden_action="reject_all",
        warden_retry_after="7",
    )
    assert post_alert(engine, resolved).status_code == 200
    assert complete(engine, model(engine), "hello").status_code == 200
    # A late duplicate of the firing is stale: it cannot re-degrade the engine.
    assert post_alert(engine, firing).json()["alerts"] == {"stale": 1}
    assert complete(engine, model(engine), "hello").status_code == 200


def test_silence_returns_the_engine_to_normal_after_the_ttl(engine: EngineProcess) -> None:
    firing = notification(
        "firing", "fp-silence", "2026-11-21T10:00:00Z", warden_action="stop_admission"
    )
    post_alert(engine, firing)
    assert complete(engine, model(engine), "hello").status_code == 503
    time.sleep(LEASE_TTL_S + 1.5)
    assert state(engine)["policy"]["stop_admission"] is False
    assert complete(engine, model(engine), "hello").status_code == 200
    samples = scrape(engine)
    assert sample(samples, catalog.DEGRADATION_ACTIVE.name, action="stop_admission") == 0


def test_cap_bounds_completion_tokens(engine: EngineProcess) -> None:
    firing = notification(
        "firing",
        "fp-cap",
        "2026-11-21T10:00:00Z",
        warden_action="cap_max_tokens",
        warden_max_tokens="6",
    )
    post_alert(engine, firing)
    before = sample(scrape(engine), catalog.MAX_TOKENS_CAPPED.name)
    for max_tokens in (50, 200):
        response = complete(engine, model(engine), "cache block", max_tokens=max_tokens)
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] <= 6
    chat = httpx.post(
        f"{engine.base_url}/v1/chat/completions",
        json={
            "model": model(engine),
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 100,
        },
        timeout=60,
    )
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] <= 6
    assert sample(scrape(engine), catalog.MAX_TOKENS_CAPPED.name) >= before + 3
    post_alert(
        engine,
        notification(
            "resolved",
            "fp-cap",
            "2026-11-21T10:00:00Z",
            warden_action="cap_max_tokens",
            warden_max_tokens="6",
        ),
    )
    assert (
        complete(engine, model(engine), "cache", max_tokens=20).json()["usage"]["completion_tokens"]
        == 20
    )


def test_shed_refuses_low_priority_while_high_priority_is_served(engine: EngineProcess) -> None:
    response = httpx.post(
        f"{engine.base_url}/warden/degrade",
        json={"action": "shed_low_priority", "params": {"priority_threshold": 1}, "ttl_s": 60},
        headers=AUTH,
    )
    assert response.status_code == 200
    low = httpx.post(
        f"{engine.base_url}/v1/completions",
        json={"model": model(engine), "prompt": "x", "max_tokens": 4},
        headers={"X-Request-Priority": "5"},
        timeout=60,
    )
    assert low.status_code == 503 and low.json()["error"]["warden_reason"] == "shed_low_priority"
    assert "retry-after" in low.headers
    high = httpx.post(
        f"{engine.base_url}/v1/completions",
        json={"model": model(engine), "prompt": "x", "max_tokens": 4},
        headers={"X-Request-Priority": "0"},
        timeout=60,
    )
    assert high.status_code == 200


def test_manual_overrides_need_the_token(engine: EngineProcess) -> None:
    body = {"action": "reject_all", "ttl_s": 60}
    url = f"{engine.base_url}/warden/degrade"
    assert httpx.post(url, json=body).status_code == 401
    assert httpx.post(url, json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.post(url, json={"action": "explode"}, headers=AUTH).status_code == 400
    assert state(engine)["leases"] == []


# The slow engine's queue limit: this many waiting and admission refuses the next request.
# Above 2, so the forecast test's three requests (at most two of them waiting) never meet it.
SLOW_QUEUE_DEPTH = 3
# Retry-After at most this on the slow engine, so a client in the reflex test can wait it out.
RETURN_CHECK_MAX_RETRY_S = 4
# Each step of the slow engine sleeps this long: a request of FLOOD_TOKENS lasts >= 2.7 s,
# whatever the machine's speed, so a flood's requests overlap and queue.
SLOW_STEP_DELAY_S = 0.03
FLOOD_TOKENS = 90
# Saturation is held this long after the last sign of it (the default 20 s): each test that
# floods the slow engine waits it out before the next.
SLOW_HOLD_S = 5


@pytest.fixture(scope="module")
def slow_engine(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcess]:
    """A tiny engine whose steps are slowed (test switch) and whose KV cache holds 10 blocks of
    32 tokens, with a queue limit: the reflex test saturates it, the forecast test fills its
    cache. One start serves both; each reads only what happened after it began."""
    run_dir = tmp_path_factory.mktemp("slow-engine")
    config = run_dir / "warden.yaml"
    config.write_text(
        "admission:\n  saturation:\n"
        f"    max_queue_depth: {SLOW_QUEUE_DEPTH}\n"
        f"    retry_after_max_s: {RETURN_CHECK_MAX_RETRY_S}\n"
        f"    hold_s: {SLOW_HOLD_S}\n"
    )
    env = {"WARDEN_CONFIG": str(config), "WARDEN_TEST_STEP_DELAY_S": str(SLOW_STEP_DELAY_S)}
    with running_engine(tiny_model, extra_args=TINY_KV_ARGS, env=env, run_dir=run_dir) as eng:
        yield eng


def test_local_reflex_refuses_within_a_second_of_the_saturation_crossing(
    tiny_model: Path, slow_engine: EngineProcess
) -> None:
    """Saturation admission is the reflex a CPU engine really triggers (its memory does not
    creep, and a full KV cache is vLLM queueing as designed). Twelve long requests on the slow
    engine (each lasts >= 2.7 s, so they overlap however busy the machine is) queue past its
    limit of 3 waiting; the controller records the crossing and the first refusal after it
    (``reactions`` in /warden/state), measured in the server: client-side timing on two busy
    cores would mostly measure the test's scheduling. A probe every 50 ms means a request is
    always about to arrive. The alert path cannot act before a scrape, a rule evaluation and
    Alertmanager's group_wait: the reflex must be under a second."""
    eng = slow_engine
    served = str(tiny_model)
    start = time.time()
    refusals: list[httpx.Response] = []
    stop = threading.Event()

    async def probe_forever() -> None:
        async with httpx.AsyncClient(base_url=eng.base_url, timeout=120) as client:

            async def probe() -> None:
                body = {"model": served, "prompt": "probe", "max_tokens": 2}
                response = await client.post("/v1/completions", json=body)
                if response.status_code == 503:
                    refusals.append(response)

            tasks = []
            for _ in range(600):  # at most 30 s of probing
                if stop.is_set():
                    break
                tasks.append(asyncio.create_task(probe()))
                await asyncio.sleep(0.05)
            await asyncio.gather(*tasks, return_exceptions=True)

    def crossed() -> dict | None:
        return next(
            (
                r
                for r in state(eng)["reactions"]
                if r["kind"] == "saturation"
                and r["crossed_at"] >= start
                and r["first_refusal_at"] is not None
            ),
            None,
        )

    prober = threading.Thread(target=lambda: asyncio.run(probe_forever()))
    prober.start()
    try:
        with ThreadPoolExecutor(12) as pool:
            flood = [
                pool.submit(complete, eng, served, LONG_PROMPT, FLOOD_TOKENS, ignore_eos=True)
                for _ in range(12)
            ]
            reaction = wait_until(crossed, 120, 0.2, "a saturation crossing and its refusal")
            results = [f.result() for f in flood]
    finally:
        stop.set()
        prober.join()
    # Whatever was admitted finished; whatever was refused was told when to come back.
    for response in results:
        assert response.status_code in (200, 503), response.text
        if response.status_code == 503:
            assert response.headers.get("retry-after"), response.headers
    assert any(r.status_code == 200 for r in results)
    print(f"\nsaturation crossing -> first refusal: {reaction['reaction_s'] * 1000:.0f} ms")
    assert reaction["signal"] == "queue_depth"
    assert reaction["value"] > SLOW_QUEUE_DEPTH - 1
    assert reaction["first_refusal"] == "saturated"
    assert reaction["reaction_s"] < 1.0
    # Every refusal names its signal and value and carries a bounded Retry-After.
    assert refusals
    error = refusals[0].json()["error"]
    assert (error["warden_reason"], error["warden_signal"]) == ("saturated", "queue_depth")
    assert error["warden_value"] >= SLOW_QUEUE_DEPTH
    assert 1 <= int(refusals[0].headers["retry-after"]) <= 30
    # /warden/state keeps each with what it was decided on: the queue it named, the batch.
    kept = [r for r in state(eng)["recent_rejections"] if r["signal"] == "queue_depth"]
    assert kept, state(eng)["recent_rejections"]
    for rejection in kept:
        basis = rejection["basis"]
        assert set(basis) == {"running", "waiting", "capacity"}, basis
        assert basis["waiting"] == rejection["value"] and basis["capacity"] == 8, basis
    # Load gone: the saturated state is held, then lets go; the engine serves again.
    wait_until(lambda: state(eng)["saturation"]["state"] == "normal", 60, 0.5, "saturation cleared")
    assert complete(eng, served, "hello").status_code == 200
    check_a_refused_clients_return_is_known_by_its_body(eng, served)


def check_a_refused_clients_return_is_known_by_its_body(eng: EngineProcess, served: str) -> None:
    """A refused request's place is held for its client; the same bytes coming back are that
    client's return (issue #28). Saturated again by a flood, two distinct requests are refused:
    one is sent again, byte for byte, at once (before its place is due, so only its bytes tell
    it from a new arrival) and, refused again, after its Retry-After: each ends its booking as
    a return. The other comes back only after its booking lapsed, and is a new arrival."""

    def in_flight() -> dict:
        return dict(state(eng)["saturation"]["in_flight"])

    def post(body: dict) -> httpx.Response:
        return httpx.post(f"{eng.base_url}/v1/completions", json=body, timeout=120)

    with ThreadPoolExecutor(12) as pool:
        flood = [
            pool.submit(complete, eng, served, LONG_PROMPT, FLOOD_TOKENS, ignore_eos=True)
            for _ in range(12)
        ]
        # Every flood request judged: refused (answered) or admitted (in flight).
        wait_until(
            lambda: sum(f.done() for f in flood) + in_flight()["admitted"] >= len(flood),
            60,
            0.1,
            "the flood judged",
        )
        refused: dict[str, tuple[dict, httpx.Response]] = {}
        for client in ("comes back", "never returns"):
            for attempt in range(10):
                body = {"model": served, "prompt": f"{client} {attempt}", "max_tokens": 2}
                response = post(body)
                if response.status_code == 503:
                    refused[client] = (body, response)
                    break
        assert set(refused) == {"comes back", "never returns"}, "the flood did not saturate"
        for _body, response in refused.values():
            # Booked for a whole second: both headers say when its place is due.
            seconds = int(response.headers["retry-after"])
            assert int(response.headers["retry-after-ms"]) == 1000 * seconds, response.headers
        before = in_flight()
        # Sent again at once, long before its place is due: only its bytes say it is a return.
        body, _response = refused["comes back"]
        again = post(body)
        answered = time.monotonic()
        assert again.status_code in (200, 503), again.text
        returned = in_flight()
        assert returned["returned"] == before["returned"] + 1, (before, returned)
        if again.status_code == 503:
            # Refused again, booked again: back after the Retry-After, a return again.
            due = answered + int(again.headers["retry-after-ms"]) / 1000
            time.sleep(max(0.0, due - time.monotonic()))
            back = post(body)
            assert back.status_code in (200, 503), back.text
            returned = in_flight()
            assert returned["returned"] == before["returned"] + 2, (before, returned)
        body, response = refused["never returns"]
        time.sleep(int(response.headers["retry-after-ms"]) / 1000 + CLAIM_GRACE_S + 0.5)
        late = post(body)
        assert late.status_code in (200, 503), late.text
        after = in_flight()
        assert after["returned"] == returned["returned"], (returned, after)
        assert after["lapsed"] > before["lapsed"], (before, after)
        for future in flood:
            assert future.result().status_code in (200, 503)


def test_nonfinite_logits_are_retried_into_a_correct_response(engine: EngineProcess) -> None:
    before = scrape(engine)
    response = complete(
        engine, model(engine), "cache block", max_tokens=12, vllm_xargs={"warden_inject": "nan"}
    )
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert response.json()["usage"]["completion_tokens"] == 12
    streamed = httpx.post(
        f"{engine.base_url}/v1/completions",
        json={
            "model": model(engine),
            "prompt": "cache",
            "max_tokens": 12,
            "stream": True,
            "vllm_xargs": {"warden_inject": "inf"},
        },
        timeout=60,
    )
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert not any('"error"' in event for event in events)
    finish = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
    assert finish[-1] == "length"
    after = scrape(engine)
    retried = sample(after, catalog.REQUEST_RETRIES.name, reason="nonfinite_logits") - sample(
        before, catalog.REQUEST_RETRIES.name, reason="nonfinite_logits"
    )
    assert retried == 2


def test_persistent_nonfinite_logits_end_in_a_clear_error(engine: EngineProcess) -> None:
    response = complete(
        engine,
        model(engine),
        "cache block",
        max_tokens=12,
        vllm_xargs={"warden_inject": "nan", "warden_inject_attempts": 99},
    )
    assert response.status_code == 500
    assert response.json()["error"]["warden_reason"] == "nonfinite_logits"
    assert "non-finite" in response.json()["error"]["message"]


payload_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
alert_shapes = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(["firing", "resolved", "bogus", 3]),
        "labels": st.dictionaries(
            st.sampled_from(
                ["alertname", "warden_action", "warden_max_tokens", "warden_circuit", "severity"]
            ),
            st.sampled_from(["cap_max_tokens", "reject_all", "-1", "open", "x", ""])
            | st.integers(),
        ),
        "startsAt": st.sampled_from(["2026-11-21T10:00:00Z", "nope", "", 12]),
        "fingerprint": st.sampled_from(["fp-fuzz", "", None]),
    },
)
bad_bodies = st.one_of(
    payload_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
    st.builds(
        lambda alerts, version: json.dumps(
            {"version": version, "status": "firing", "alerts": alerts}
        ).encode(),
        st.lists(alert_shapes, max_size=3),
        st.sampled_from(["4", "3", 4]),
    ),
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=bad_bodies,
    auth=st.sampled_from([AUTH, {}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}]),
    content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form"]),
)
def test_bad_webhook_input_is_never_5xx_and_never_changes_state(
    engine: EngineProcess, body: bytes, auth: dict, content_type: str
) -> None:
    before = state(engine)
    response = httpx.post(
        f"{engine.base_url}/warden/alertmanager",
        content=body,
        headers={**auth, "content-type": content_type},
        timeout=10,
    )
    assert response.status_code < 500
    if response.status_code == 200:
        # A well-formed notification got through: only with the valid token, and it may only
        # have added or changed the lease of its own alerts (those named fp-fuzz).
        assert auth == AUTH, (auth, body)
        after = state(engine)
        touched = {("alertmanager", "fp-fuzz")}
        _unchanged_but_expired(before["leases"], after["leases"], touched)
        assert set(_by_key(after["leases"])) <= set(_by_key(before["leases"])) | touched
        fuzzed = _by_key(after["leases"]).get(("alertmanager", "fp-fuzz"))
        if fuzzed is not None:
            sent = json.loads(body)["alerts"]
            asked = {a.get("labels", {}).get("warden_action") for a in sent if isinstance(a, dict)}
            assert fuzzed["action"] in asked, (fuzzed, sent)
        httpx.post(
            f"{engine.base_url}/warden/alertmanager",
            headers=AUTH,
            timeout=10,
            # The one real startsAt the fuzzed alerts carry (a resolution dated in the future
            # is refused: it would stale every firing until then).
            json=notification("resolved", "fp-fuzz", "2026-11-21T10:00:00Z"),
        )
        return
    after = state(engine)
    assert after["leases"] == before["leases"]
    assert after["policy"] == before["policy"]


def _by_key(leases: list[dict]) -> dict[tuple[str, str], dict]:
    return {(lease["source"], lease["key"]): lease for lease in leases}


def _unchanged_but_expired(before: list[dict], after: list[dict], touched: set) -> None:
    """Every lease of ``before`` not in ``touched`` is in ``after`` exactly as it was, or is
    gone because its TTL ran out meanwhile (alertmanager leases here live LEASE_TTL_S)."""
    now = time.time()
    then, later = _by_key(before), _by_key(after)
    for key, lease in then.items():
        if key in touched:
            continue
        if key in later:
            assert later[key] == lease, (key, lease, later[key])
        else:
            assert lease["expires_at"] <= now, f"lease {key} vanished before its TTL: {lease}"


def test_the_webhook_changes_only_the_leases_its_notification_names(
    engine: EngineProcess,
) -> None:
    """A valid notification with the valid token: 200, its own lease added with the labelled
    action and parameters, every other lease (manual, another alert's) left exactly as it was."""
    manual = httpx.post(
        f"{engine.base_url}/warden/degrade",
        json={
            "action": "cap_max_tokens",
            "params": {"max_tokens": 5000},
            "ttl_s": 600,
            "key": "kept",
        },
        headers=AUTH,
        timeout=10,
    )
    assert manual.status_code == 200, manual.text
    other = notification(
        "firing", "fp-other", "2026-11-21T10:00:00Z", warden_action="stop_admission"
    )
    assert post_alert(engine, other).status_code == 200
    before = state(engine)["leases"]
    assert ("manual", "kept") in _by_key(before) and ("alertmanager", "fp-other") in _by_key(before)

    target = notification(
        "firing",
        "fp-target",
        "2026-11-21T10:00:00Z",
        warden_action="cap_max_tokens",
        warden_max_tokens="77",
    )
    response = post_alert(engine, target)
    assert response.status_code == 200, response.text
    assert response.json()["alerts"] == {"applied": 1}
    after = state(engine)["leases"]
    added = _by_key(after)[("alertmanager", "fp-target")]
    assert added["action"] == "cap_max_tokens" and added["params"] == {"max_tokens": 77}, added
    assert added["alertname"] == "WardenTest"
    _unchanged_but_expired(before, after, {("alertmanager", "fp-target")})
    assert set(_by_key(after)) - set(_by_key(before)) == {("alertmanager", "fp-target")}
    for fired in (other, target):  # clean_policy clears manual leases only
        alert = fired["alerts"][0]
        labels = {k: v for k, v in alert["labels"].items() if k not in ("alertname", "instance")}
        resolved = notification("resolved", alert["fingerprint"], alert["startsAt"], **labels)
        assert post_alert(engine, resolved).status_code == 200


@pytest.mark.parametrize(
    "auth",
    [
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": TOKEN},  # the right secret without the scheme
        {"Authorization": f"Basic {TOKEN}"},
        {},
    ],
    ids=["wrong", "longer", "no-scheme", "basic", "none"],
)
def test_a_valid_notification_with_a_wrong_token_is_401_and_changes_nothing(
    engine: EngineProcess, auth: dict[str, str]
) -> None:
    firing = notification(
        "firing", "fp-intruder", "2026-11-21T10:00:00Z", warden_action="reject_all"
    )
    before = state(engine)
    response = httpx.post(
        f"{engine.base_url}/warden/alertmanager", json=firing, headers=auth, timeout=10
    )
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    after = state(engine)
    assert ("alertmanager", "fp-intruder") not in _by_key(after["leases"])
    _unchanged_but_expired(before["leases"], after["leases"], set())
    assert after["policy"]["reject_all"] is False


def test_a_preempted_request_is_retried_to_a_whole_200(engine: EngineProcess) -> None:
    """Preempt-the-largest aborts the one long request in flight; the middleware resubmits
    it and the client gets the whole answer (all its tokens), not an error.

    The engine core is paused (SIGSTOP) before the request is sent, and the preemption comes
    once vLLM's API process holds the request (its unfinished count, in /warden/state): the
    request is in flight whatever the machine's speed, where polling a gauge for a running
    request could miss a request that finished between two slow scrapes. The abort and the
    resubmission wait for the core to continue."""
    core = find_engine_core(psutil.Process(engine.process.pid))
    before = scrape(engine)
    retried = catalog.REQUEST_RETRIES.name
    with ThreadPoolExecutor(1) as pool:
        core.suspend()
        try:
            pending = pool.submit(
                complete, engine, model(engine), LONG_PROMPT, 180, 300.0, ignore_eos=True
            )
            wait_until(
                lambda: (state(engine)["saturation"]["in_flight"]["engine"] or 0) >= 1,
                60,
                0.05,
                "the long request held by vLLM's API process",
            )
            lease = httpx.post(
                f"{engine.base_url}/warden/degrade",
                json={
                    "action": "cap_max_tokens",
                    "params": {"max_tokens": 10_000, "preempt": 1},
                    "ttl_s": 60,
                    "key": "preempt-largest",
                },
                headers=AUTH,
                timeout=10,
            )
            assert lease.status_code == 200, lease.text
        finally:
            core.resume()
        response = pending.result(timeout=300)
    after = scrape(engine)
    assert (
        sample(after, catalog.WARDEN_PREEMPTIONS.name)
        - sample(before, catalog.WARDEN_PREEMPTIONS.name)
        == 1
    )
    assert (
        sample(after, retried, reason="warden_preemption")
        - sample(before, retried, reason="warden_preemption")
        == 1
    )
    assert classify(response.status_code, response.headers, response.content) == COMPLETED
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert response.json()["usage"]["completion_tokens"] == 180


def test_huge_body_is_refused_without_state_change(engine: EngineProcess) -> None:
    before = state(engine)
    body = b'{"version": "4", "alerts": [' + b'{"x": 1},' * 200_000 + b"{}]}"
    response = httpx.post(
        f"{engine.base_url}/warden/alertmanager",
        content=body,
        headers={**AUTH, "content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400 and "too large" in response.text
    assert state(engine)["leases"] == before["leases"]


def test_200_concurrent_requests_while_the_policy_toggles(engine: EngineProcess) -> None:
    """Every request ends in a full response or an explicit 503/429 with Retry-After."""

    async def run() -> list[httpx.Response | BaseException]:
        async with httpx.AsyncClient(base_url=engine.base_url, timeout=180) as client:
            stop = asyncio.Event()

            async def toggle() -> None:
                actions = [
                    {"action": "stop_admission", "ttl_s": 30, "key": "toggle"},
                    {
                        "action": "cap_max_tokens",
                        "params": {"max_tokens": 3},
                        "ttl_s": 30,
                        "key": "toggle",
                    },
                    {
                        "action": "circuit_breaker",
                        "params": {"circuit": "half_open"},
                        "ttl_s": 30,
                        "key": "toggle",
                    },
                ]
                index = 0
                while not stop.is_set():
                    await client.post("/warden/degrade", json=actions[index % 3], headers=AUTH)
                    await asyncio.sleep(0.1)
                    await client.delete("/warden/degrade?key=toggle", headers=AUTH)
                    await asyncio.sleep(0.1)
                    index += 1

            async def one(i: int) -> httpx.Response:
                await asyncio.sleep(i * 0.015)  # arrivals spread over 3 s of toggling
                body = {
                    "model": model(engine),
                    "prompt": f"request {i}",
                    "max_tokens": 8,
                    "stream": i % 4 == 0,
                }
                return await client.post("/v1/completions", json=body)

            toggler = asyncio.create_task(toggle())
            results = await asyncio.gather(*(one(i) for i in range(200)), return_exceptions=True)
            stop.set()
            await toggler
            return results

    results = asyncio.run(run())
    assert len(results) == 200
    tally = OutcomeTally()
    for i, result in enumerate(results):
        if not isinstance(result, httpx.Response):
            tally.add(FAILED, f"request {i}: {result!r}")
            continue
        outcome = classify(result.status_code, result.headers, result.content, stream=i % 4 == 0)
        tally.add(outcome, f"request {i}: {result.status_code} {result.text[:300]}")
        if outcome == COMPLETED and i % 4:
            assert result.json()["choices"][0]["finish_reason"] in ("length", "stop")
        if outcome == REFUSED:
            assert int(result.headers["retry-after"]) >= 1
    print(f"\noutcomes under toggling: {tally.line()}")
    # A retries-exhausted 503 is a failure, though it carries Retry-After: none is allowed.
    assert tally.counts[FAILED] == 0, tally.failures
    assert tally.counts[COMPLETED] > 0 and tally.counts[REFUSED] > 0, tally.line()
    assert tally.total == 200


def test_spans_are_exported_over_otlp(engine: EngineProcess, otlp: OtlpReceiver) -> None:
    post_alert(
        engine,
        notification("firing", "fp-span", "2026-11-21T10:00:00Z", warden_action="stop_admission"),
    )
    complete(engine, model(engine), "hello")
    post_alert(
        engine,
        notification("resolved", "fp-span", "2026-11-21T10:00:00Z", warden_action="stop_admission"),
    )
    wanted = {
        "warden.webhook",
        "warden.lease.applied",
        "warden.lease.released",
        "warden.reject",
    }

    def applied() -> list[dict]:
        return [
            s
            for s in otlp.spans
            if s["name"] == "warden.lease.applied"
            and s["attributes"]["warden.lease.key"].string_value == "fp-span"
        ]

    with contextlib.suppress(TimeoutError):
        wait_until(lambda: wanted <= otlp.names() and applied(), 10, 0.2, "spans exported")
    assert wanted <= otlp.names()
    span = applied()[0]["attributes"]
    assert span["warden.action"].string_value == "stop_admission"
    assert span["warden.source"].string_value == "alertmanager"
    assert span["warden.alertname"].string_value == "WardenTest"
    assert span["warden.lease.expires_at"].double_value > time.time()


def test_unknown_actions_are_counted_and_ignored(engine: EngineProcess) -> None:
    before = sample(scrape(engine), catalog.WEBHOOK_NOTIFICATIONS.name, outcome="unknown_action")
    response = post_alert(
        engine, notification("firing", "fp-unknown", "2026-11-21T10:00:00Z", warden_action="reboot")
    )
    assert response.status_code == 200
    assert response.json()["policy"]["stop_admission"] is False
    after = sample(scrape(engine), catalog.WEBHOOK_NOTIFICATIONS.name, outcome="unknown_action")
    assert after == before + 1


def test_kv_forecast_refuses_what_can_never_fit_and_a_full_cache_only_queues(
    tiny_model: Path, slow_engine: EngineProcess
) -> None:
    """Forecast admission (on by default) on the slow engine: 10 blocks of 32 tokens. A prompt
    that can never fit is a 400 naming the prompt's size; a full cache alone refuses nothing
    and caps nothing: vLLM queues the request until blocks free up (#10.2). Three requests at
    once keep at most two waiting, under the engine's queue limit, so nothing here is refused
    for saturation either; refusals before this test (the reflex test's) are not counted."""
    eng = slow_engine
    wait_until(lambda: state(eng)["saturation"]["state"] == "normal", 60, 0.5, "saturation cleared")
    since = time.time()
    capped_before = sample(scrape(eng), catalog.MAX_TOKENS_CAPPED.name)
    never = complete(eng, str(tiny_model), " ".join(["memory"] * 300), max_tokens=4)
    assert never.status_code == 400
    error = never.json()["error"]
    assert error["warden_reason"] == "kv_never_fits"
    assert "never fit" in error["message"]
    assert error["warden_signal"] == "prompt_tokens" and error["warden_value"] >= 300
    assert not never.headers.get("retry-after")
    # Three long requests at once: together they need far more than the 10 blocks.
    with ThreadPoolExecutor(3) as pool:
        results = list(
            pool.map(
                lambda _: complete(eng, str(tiny_model), LONG_PROMPT, 180, ignore_eos=True),
                range(3),
            )
        )
    for response in results:
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 180
    assert sample(scrape(eng), catalog.MAX_TOKENS_CAPPED.name) == capped_before
    refused = [
        r
        for r in state(eng)["recent_rejections"]
        if r["at"] >= since and r["reason"] != "kv_never_fits"
    ]
    assert refused == []


def test_degrade_command_sets_lists_and_clears(engine: EngineProcess, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    base = [sys.executable, "-m", "warden.cli", "degrade", "--engine-url", engine.base_url]

    def warden(*args: str, token: bool = True) -> subprocess.CompletedProcess[str]:
        extra = ["--token-file", str(token_file)] if token else []
        return subprocess.run([*base, *extra, *args], capture_output=True, text=True, timeout=60)

    done = warden("set", "cap_max_tokens", "--param", "max_tokens=7", "--ttl", "60", "--key", "ops")
    assert done.returncode == 0, done.stderr
    assert "ops" in done.stdout and '"cap_max_tokens": 7' in done.stdout
    listed = warden("list", token=False)
    assert "manual" in listed.stdout and "cap_max_tokens" in listed.stdout
    usage = complete(engine, model(engine), "x", max_tokens=50).json()["usage"]
    assert usage["completion_tokens"] <= 7
    refused = warden("set", "cap_max_tokens", "--param", "max_tokens=-1")
    assert refused.returncode == 1 and "warden_max_tokens" in refused.stderr
    wrong = subprocess.run(
        [*base, "set", "reject_all"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "WARDEN_WEBHOOK_TOKEN": "wrong"},
    )
    assert wrong.returncode == 1 and "401" in wrong.stderr
    cleared = warden("clear", "--key", "ops")
    assert cleared.returncode == 0 and "no live leases" in cleared.stdout
