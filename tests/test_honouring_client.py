"""The overload benchmark's client that honours Retry-After, against a real HTTP server.

Its figures back a claim of issue #28 (a Retry-After is right when clients that wait it are
admitted on their return), so the counting is checked here on a server whose answers are known.
"""

from __future__ import annotations

import time
from collections import Counter

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from benchmarks.honouring_client import Prompt, retry_after_s, run_honouring
from tests.support.asgi import serving

WAIT_S = 1


def _server(seen: Counter[str], sent_at: dict[str, list[float]]) -> Starlette:
    """Refuses each prompt's first attempt with a Retry-After (a prompt starting "twice" is
    refused twice; one starting "bare" gets a 503 without Retry-After), then answers."""

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        prompt = body["prompt"]
        seen[prompt] += 1
        sent_at.setdefault(prompt, []).append(time.monotonic())
        if prompt.startswith("bare"):
            return JSONResponse({"error": "overloaded"}, status_code=503)
        refusals = 2 if prompt.startswith("twice") else 1
        if seen[prompt] <= refusals:
            status = 429 if prompt.startswith("twice") else 503
            return JSONResponse(
                {"error": "overloaded"}, status_code=status, headers={"Retry-After": str(WAIT_S)}
            )
        usage = {"completion_tokens": body["max_tokens"]}
        return JSONResponse({"choices": [{"text": "x"}], "usage": usage})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def test_refused_requests_wait_the_retry_after_and_are_counted_by_how_they_returned() -> None:
    seen: Counter[str] = Counter()
    sent_at: dict[str, list[float]] = {}
    prompts = [Prompt(f"once {i}", 4) for i in range(6)]
    prompts += [Prompt("twice 0", 4), Prompt("bare 0", 4)]
    with serving(_server(seen, sent_at)) as url:
        summary = run_honouring(url, "m", rate=50.0, count=len(prompts), slo_s=5.0, prompts=prompts)
    assert summary["completed"] == 7
    assert summary["refused_requests"] == 8
    assert summary["refusals"] == 6 + 2 + 1
    assert summary["returned"] == 7  # "bare" had no Retry-After to wait
    assert summary["admitted_on_first_return"] == 6
    assert summary["eventually_admitted"] == 7
    assert summary["no_retry_after"] == 1
    assert summary["lost"] == 0 and summary["gave_up"] == 0
    assert summary["failed"] == 1
    assert summary["median_retry_after_s"] == WAIT_S
    # All seven came back about 1 s into the run; "twice 0" was refused again then.
    assert summary["first_returns_by_time"] == [[7, 1]]
    for prompt in ("once 0", "twice 0"):
        gaps = [b - a for a, b in zip(sent_at[prompt], sent_at[prompt][1:], strict=False)]
        assert gaps and all(gap >= WAIT_S - 0.05 for gap in gaps), (prompt, gaps)


def test_a_client_gives_up_after_its_returns() -> None:
    seen: Counter[str] = Counter()
    with serving(_server(seen, {})) as url:
        summary = run_honouring(
            url, "m", 50.0, 1, slo_s=5.0, max_returns=1, prompts=[Prompt("twice 1", 4)]
        )
    assert summary["gave_up"] == 1 and summary["completed"] == 0
    assert seen["twice 1"] == 2


def test_a_retry_after_a_client_can_use() -> None:
    assert retry_after_s("3") == 3.0
    assert retry_after_s(" 1.5 ") == 1.5
    assert retry_after_s(None) is None
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert retry_after_s("-1") is None
