"""warden relay's parts (#12 item 2): the selector, identity matching, bounded retries."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.support.asgi import serving
from warden.relay.deliver import DeliveryPolicy, deliver
from warden.relay.directory import UrlTemplate, selector_matches
from warden.relay.split import Engine, matching_engines, plan

TOKEN = "relay-unit-token"
JOB = "vllm-warden"


def test_the_engine_selector_has_promql_semantics() -> None:
    matchers = [("job", "=~", "vllm-.*"), ("namespace", "!=", "test"), ("env", "!~", "dev|ci")]
    assert selector_matches({"job": "vllm-warden", "namespace": "prod"}, matchers)
    assert not selector_matches({"job": "xvllm-warden"}, matchers)  # anchored
    assert not selector_matches({"job": "vllm-a", "namespace": "test"}, matchers)
    assert not selector_matches({"job": "vllm-a", "env": "ci"}, matchers)
    assert selector_matches({"job": "vllm-a"}, [("env", "=", "")])  # missing label is ""
    assert selector_matches({"job": "a.b"}, [("job", "=~", "a\\\\.b")])  # PromQL escape


def test_alerts_are_matched_by_every_identity_label_both_sides_have() -> None:
    prod = Engine({"instance": "vllm-0", "namespace": "prod", "job": JOB}, "http://p/hook")
    staging = Engine({"instance": "vllm-0", "namespace": "staging", "job": JOB}, "http://s/hook")
    identity = ("cluster", "namespace", "instance")
    engines = [prod, staging]
    assert matching_engines({"instance": "vllm-0", "namespace": "prod"}, engines, identity) == [
        prod
    ]
    # The cluster external label is on alerts, not on targets: not compared.
    found = matching_engines(
        {"instance": "vllm-0", "namespace": "staging", "cluster": "eu"}, engines, identity
    )
    assert found == [staging]
    # Without namespace on the alert both match: ambiguous, delivered to neither.
    alerts = [{"labels": {"instance": "vllm-0"}}, {"labels": {"alertname": "fleet"}}]
    routed = plan(alerts, {0: matching_engines(alerts[0]["labels"], engines, identity)})
    assert routed.by_engine == {}
    assert routed.outcomes == {"ambiguous": 1, "fleet_wide": 1}


def test_deliveries_retry_transient_failures_only() -> None:
    """503, 503, 200: delivered on the third attempt; 401: refused at once, never retried."""
    answers = {"/flaky": [503, 503, 200], "/locked": [401, 200]}
    seen: dict[str, int] = {"/flaky": 0, "/locked": 0}
    app = FastAPI()

    @app.post("/{name}")
    async def hook(name: str, request: Request) -> JSONResponse:
        path = f"/{name}"
        status = answers[path][seen[path]]
        seen[path] += 1
        return JSONResponse({}, status_code=status)

    async def both(url: str) -> tuple[Any, Any]:
        policy = DeliveryPolicy(attempts=3, backoff_base_s=0.01, backoff_max_s=0.02)
        retries: list[int] = []
        async with httpx.AsyncClient() as client:
            flaky = await deliver(
                client,
                f"{url}/flaky",
                b"{}",
                1,
                TOKEN,
                policy,
                lambda: retries.append(1),
                random.Random(0),
            )
            locked = await deliver(client, f"{url}/locked", b"{}", 1, TOKEN, policy)
        assert len(retries) == 2
        return flaky, locked

    with serving(app) as url:
        flaky, locked = asyncio.run(both(url))
    assert (flaky.outcome, flaky.attempts, flaky.status) == ("delivered", 3, 200)
    assert (locked.outcome, locked.attempts, locked.status) == ("refused", 1, 401)
    assert seen == {"/flaky": 3, "/locked": 1}


def test_a_url_template_addresses_static_fleets_by_instance() -> None:
    template = UrlTemplate("http://{instance}/warden/alertmanager")
    found = asyncio.run(template.lookup({"instance": "gpu-3:8000", "alertname": "x"}))
    assert [e.webhook_url for e in found] == ["http://gpu-3:8000/warden/alertmanager"]
    assert asyncio.run(template.lookup({"alertname": "fleet-wide"})) == []
