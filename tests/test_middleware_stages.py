"""The middleware's stages in pieces: the one guarded HTTP input (bounded, typed, parsed to a clear
4xx, for ASGI and Starlette alike), the retry tag spliced into the client's bytes only where that
means the same body, the forecast's token count, and the breaker's one half-open gate."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from exporter.metrics import WardenMetrics
from tests.support.asgi import post_json
from warden.common.http_input import BodyRules, InputRefused, read_json
from warden.control.actions import parse_action
from warden.control.admission import KvState, RequestFacts
from warden.control.config import ControlConfig
from warden.control.controller import Controller
from warden.engine import middleware
from warden.engine.forecast import Forecast, count_tokens, deciding_blocks, token_bound
from warden.engine.retry_stage import spliced
from warden.engine.runtime import EngineRuntime


def receiving(*messages: dict[str, Any]) -> Any:
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    return receive


def chunk(body: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def test_the_head_is_checked_before_a_byte_is_read() -> None:
    rules = BodyRules(100, json_only=True)
    assert rules.check_head("application/json; charset=utf-8", "12") == 12
    assert rules.check_head("Application/JSON", None) is None
    for content_type, length, status in (
        ("text/plain", "1", 415),
        (None, "1", 415),
        ("application/json", "12abc", 400),
        ("application/json", "-1", 400),
        ("application/json", "101", 413),
    ):
        with pytest.raises(InputRefused) as refused:
            rules.check_head(content_type, length)
        assert refused.value.status == status, (content_type, length)
    with pytest.raises(InputRefused) as refused:
        BodyRules(100, too_large_status=400).check_head(None, "101")
    assert refused.value.status == 400 and "too large (limit 100 bytes)" in str(refused.value)


def test_an_asgi_body_is_read_whole_and_cut_off_past_the_limit() -> None:
    rules = BodyRules(10)
    read = rules.read_asgi
    assert asyncio.run(read(receiving(chunk(b"0123456789")))) == b"0123456789"
    assert asyncio.run(read(receiving(chunk(b"01234", True), chunk(b"56789")))) == b"0123456789"
    assert asyncio.run(read(receiving(chunk(b"01", True), {"type": "http.disconnect"}))) is None
    for messages in ([chunk(b"x" * 11)], [chunk(b"x" * 6, True), chunk(b"x" * 5, True)]):
        with pytest.raises(InputRefused) as refused:
            asyncio.run(read(receiving(*messages)))
        assert refused.value.status == 413 and refused.value.reason == "too_large"


def test_a_body_passed_on_unread_is_cut_off_past_the_limit() -> None:
    cut: list[bool] = []
    receive = BodyRules(10).bounded(
        receiving(chunk(b"x" * 6, True), chunk(b"x" * 5)), lambda: cut.append(True)
    )

    async def app_reads() -> list[str]:
        return [(await receive())["type"], (await receive())["type"]]

    assert asyncio.run(app_reads()) == ["http.request", "http.disconnect"]
    assert cut == [True]


def test_a_starlette_request_reads_through_the_same_rules() -> None:
    app = FastAPI()

    @app.post("/in")
    async def take(request: Request) -> JSONResponse:
        try:
            data = await read_json(BodyRules(64, json_only=True, too_large_status=400), request)
        except InputRefused as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        return JSONResponse({"got": data})

    client = TestClient(app)
    assert client.post("/in", json={"a": 1}).json() == {"got": {"a": 1}}
    assert (
        client.post("/in", content=b"{}", headers={"content-type": "text/plain"}).status_code == 415
    )
    assert client.post("/in", json={"a": "x" * 100}).status_code == 400
    refused = client.post("/in", content=b"{nope", headers={"content-type": "application/json"})
    assert refused.status_code == 400 and "not JSON" in refused.json()["error"]

    def chunks() -> Any:  # no Content-Length: counted while it streams
        yield b'{"a": "'
        yield b"x" * 100
        yield b'"}'

    streamed = client.post("/in", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 400 and "too large" in streamed.json()["error"]


def test_the_tag_is_spliced_only_where_it_means_the_same_body() -> None:
    tag = {"warden_rid": "warden-1", "warden_attempt": 1}
    for raw in (b'{"prompt": "hi", "max_tokens": 2}', b'  {"a": [1, {"b": null}]}\n', b"{}"):
        body = json.loads(raw)
        out = spliced(raw, body, "vllm_xargs", tag)
        assert out is not None and json.loads(out) == {**body, "vllm_xargs": tag}, raw
    # The field present under any spelling, or a body in another encoding: re-encode instead.
    escaped = b'{"vllm\\u005fxargs": {"k": 1}}'
    assert spliced(escaped, json.loads(escaped), "vllm_xargs", tag) is None
    utf16 = '{"prompt": "hi"}'.encode("utf-16-le")
    assert spliced(utf16, json.loads(utf16), "vllm_xargs", tag) is None


def test_the_forecast_counts_the_tokens_encode_counts(tiny_model: Path) -> None:
    """The backend asked directly gives ``encode``'s count; with a truncation left set on it by
    an earlier call, ``encode`` is asked (it resets it), so the count is never truncated."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    for prompt in ("", "hi", "héllo wörld 😀 \n\n x", "memory " * 300):
        assert count_tokens(tokenizer, prompt) == len(tokenizer.encode(prompt)), prompt
    tokenizer("memory memory memory", truncation=True, max_length=2)
    assert tokenizer.backend_tokenizer.truncation is not None
    assert count_tokens(tokenizer, "memory " * 300) == len(tokenizer.encode("memory " * 300)) > 2


def test_the_forecast_counts_a_prompt_only_where_the_count_can_change_admission(
    tiny_model: Path,
) -> None:
    """The bound is never below the count (unicode, a normalizer's expansions, special tokens
    included); a prompt whose bound fits in the free blocks (the whole cache, without a
    saturation limit) is not tokenized, one that may not fit is counted."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    prompts = ["", "hi", "héllo wörld 😀 \n\n x", "memory " * 300, "\ufdfa" * 40, "㎒ ﬁ ½" * 30]
    for prompt in prompts:
        assert token_bound(prompt) >= count_tokens(tokenizer, prompt), prompt

    class Client:
        def get_tokenizer(self) -> Any:
            return tokenizer

    forecast = Forecast(SimpleNamespace(engine_client=Client()))  # type: ignore[arg-type]
    body = {"prompt": "memory " * 300}
    counted = count_tokens(tokenizer, body["prompt"])

    def tokens(kv: KvState | None, saturation_judged: bool = True) -> int | None:
        room = deciding_blocks(kv, 1, saturation_judged) if kv is not None else 0
        return asyncio.run(forecast.prompt_tokens("/v1/completions", body, kv, room))

    assert tokens(KvState(total_blocks=1000, block_size=32, usage=0.0)) is None
    assert tokens(KvState(total_blocks=1000, block_size=32, usage=0.9)) == counted
    assert tokens(KvState(total_blocks=10, block_size=32, usage=0.0)) == counted
    assert tokens(None) == counted
    # Without a saturation limit only "never fits" reads the count: a full cache, a busy
    # engine's normal state, does not have the prompt tokenized again; a small one does.
    assert tokens(KvState(total_blocks=1000, block_size=32, usage=1.0), False) is None
    assert tokens(KvState(total_blocks=10, block_size=32, usage=0.0), False) == counted


# --- the circuit breaker's half-open share: one gate --------------------------------------------


async def engine_ok(scope: dict, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def test_the_half_open_share_is_counted_by_the_breakers_one_gate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The middleware lets the half-open share through by the controller's own gate: a decision
    the controller made (here, ``decide``) and a request at the front door draw on one credit,
    so with half the requests let through, the two alternate; a refusal names its signal."""
    control = Controller(ControlConfig(), WardenMetrics(CollectorRegistry()))
    rt = EngineRuntime(control, WardenMetrics(CollectorRegistry()))
    half_open = parse_action("circuit_breaker", {"circuit": "half_open", "admit_fraction": 0.5})
    control.set_manual("breaker", half_open, 60.0)
    app = middleware.WardenMiddleware(engine_ok, rt)

    def status_at_the_door() -> tuple[int, dict[str, Any]]:
        sent = post_json(app, {"prompt": "hi", "max_tokens": 2})
        start = next(m for m in sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start["status"], json.loads(body) if body else {}

    assert control.decide(RequestFacts()).reason == "circuit_half_open"  # credit 0.5
    assert status_at_the_door()[0] == 200  # credit 1.0: let through
    status, answer = status_at_the_door()  # credit 0.5 again
    assert status == 503 and answer["error"]["warden_reason"] == "circuit_half_open"
    assert answer["error"]["warden_signal"] == "manual"
    assert control.decide(RequestFacts()).admit  # the door's refusal left the credit at 1.0
