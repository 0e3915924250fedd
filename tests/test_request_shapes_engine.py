"""Do no harm: ordinary request shapes on a healthy engine under warden are answered 200, and
warden intervenes in none of them (issue 10, item 5).

Many of these shapes make vLLM write ``-inf`` into the logits on purpose (min_tokens,
allowed_token_ids, bad_words, logit_bias, grammar bitmasks for response_format and structured
outputs); a non-finite check that took that for a fault retried and failed them. Each request
here goes to a real vLLM CPU engine on the tiny model with every warden hook, and warden's
intervention counters (non-finite logits, retries, exhausted retries, admission rejections,
max_tokens caps, requests answered with an error) must not move. Structured outputs use vLLM's
default backend (xgrammar) with the tiny model's byte-level BPE tokenizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from exporter import catalog
from tests.support.engine import sample, scrape
from warden.supervisor.engine import EngineProcess

pytestmark = pytest.mark.engine

INTERVENTIONS: tuple[tuple[catalog.MetricSpec, str | None, tuple[str, ...]], ...] = (
    (catalog.NONFINITE_LOGITS, "kind", catalog.NONFINITE_KINDS),
    (catalog.REQUEST_RETRIES, "reason", catalog.RETRY_REASONS),
    (catalog.REQUEST_RETRIES_EXHAUSTED, "reason", catalog.RETRY_REASONS),
    (catalog.ADMISSION_REJECTIONS, "reason", catalog.ADMISSION_REASONS),
    (catalog.MAX_TOKENS_CAPPED, None, ()),
    (catalog.REQUESTS, "outcome", ("client_error", "server_error", "rejected")),
    (catalog.REFLEX_ACTIONS, None, ()),
)
PROMPT = "memory watermark cache block engine request"
SYSTEM = "You answer in one short line about memory."


@pytest.fixture
def engine(plain_engine: EngineProcess) -> EngineProcess:
    """Warden as ``warden serve`` wires it, default settings: no test switch. The session's
    plain engine (tests/support/shared_engine.py), shared with test_nonfinite_engine.py: its
    model is the stack's tiny model, and no prompt here holds the model's NaN token."""
    return plain_engine


def interventions(samples: dict[str, float]) -> dict[str, float]:
    """Every intervention counter of warden, one entry per label value."""
    out = {}
    for spec, label, values in INTERVENTIONS:
        if label is None:
            out[spec.name] = sample(samples, spec.name)
        for value in values:
            out[f"{spec.name}{{{label}={value}}}"] = sample(samples, spec.name, **{label: value})
    return out


def token_ids(engine: EngineProcess, text: str) -> list[int]:
    response = httpx.post(
        f"{engine.base_url}/tokenize",
        json={"model": str(engine.spec.model), "prompt": text, "add_special_tokens": False},
        timeout=30,
    )
    response.raise_for_status()
    return list(response.json()["tokens"])


def completion(**body: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/completions", {"prompt": PROMPT, "max_tokens": 16, **body}


def chat(**body: Any) -> tuple[str, dict[str, Any]]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    return "/v1/chat/completions", {"messages": messages, "max_tokens": 16, **body}


def text_of(answer: dict[str, Any]) -> str:
    choice = answer["choices"][0]
    return str(choice.get("text") if "text" in choice else choice["message"]["content"])


Check = Callable[[dict[str, Any]], None]


def no_check(answer: dict[str, Any]) -> None:
    pass


def one_of(*choices: str) -> Check:
    def check(answer: dict[str, Any]) -> None:
        assert text_of(answer) in choices

    return check


def matches(pattern: str) -> Check:
    def check(answer: dict[str, Any]) -> None:
        if answer["choices"][0]["finish_reason"] == "stop":
            assert re.fullmatch(pattern, text_of(answer)), text_of(answer)

    return check


def min_tokens_held(answer: dict[str, Any]) -> None:
    assert answer["usage"]["completion_tokens"] >= 8


def three_choices(answer: dict[str, Any]) -> None:
    assert sorted(c["index"] for c in answer["choices"]) == [0, 1, 2]


def has_logprobs(answer: dict[str, Any]) -> None:
    choice = answer["choices"][0]
    assert choice["logprobs"] is not None


SCHEMA = {
    "type": "object",
    "properties": {"level": {"type": "string", "enum": ["normal", "high"]}},
    "required": ["level"],
    "additionalProperties": False,
}

SHAPES: dict[str, tuple[tuple[str, dict[str, Any]], Check]] = {
    "min_tokens": (completion(min_tokens=8, max_tokens=12), min_tokens_held),
    "bad_words": (completion(bad_words=["memory", " cache", "block"]), no_check),
    "logit_bias": (completion(logit_bias={"4": -100, "5": 100}, max_tokens=4), no_check),
    "response_format_json_object": (
        chat(response_format={"type": "json_object"}, max_tokens=24),
        no_check,
    ),
    "response_format_json_schema": (
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "level", "schema": SCHEMA, "strict": True},
            },
            max_tokens=48,
        ),
        no_check,
    ),
    "structured_outputs_choice": (
        completion(structured_outputs={"choice": ["normal", "critical"]}),
        one_of("normal", "critical"),
    ),
    "structured_outputs_regex": (
        completion(structured_outputs={"regex": "(memory|cache) [0-9]{2}"}),
        matches("(memory|cache) [0-9]{2}"),
    ),
    "stop_strings": (completion(stop=["cache", "engine"], max_tokens=24), no_check),
    "n_greater_than_one": (completion(n=3, max_tokens=8), three_choices),
    "logprobs_completion": (completion(logprobs=3, max_tokens=6), has_logprobs),
    "logprobs_chat": (chat(logprobs=True, top_logprobs=2, max_tokens=6), has_logprobs),
    "chat_with_system_prompt": (chat(temperature=0.7, seed=7), no_check),
    "greedy": (completion(temperature=0.0), no_check),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_ordinary_request_is_answered_without_intervention(
    engine: EngineProcess, shape: str
) -> None:
    (path, body), check = SHAPES[shape]
    before = interventions(scrape(engine))
    payload = {"model": str(engine.spec.model), **body}
    response = httpx.post(f"{engine.base_url}{path}", json=payload, timeout=120)
    assert response.status_code == 200, response.text[:500]
    check(response.json())
    assert interventions(scrape(engine)) == before


def test_allowed_token_ids_is_answered_without_intervention(engine: EngineProcess) -> None:
    allowed = token_ids(engine, " memory cache block")
    before = interventions(scrape(engine))
    payload = {
        "model": str(engine.spec.model),
        "prompt": PROMPT,
        "max_tokens": 8,
        "allowed_token_ids": allowed,
    }
    response = httpx.post(f"{engine.base_url}/v1/completions", json=payload, timeout=120)
    assert response.status_code == 200, response.text[:500]
    assert interventions(scrape(engine)) == before


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streaming_is_answered_without_intervention(engine: EngineProcess, path: str) -> None:
    body = dict(completion(min_tokens=4)[1] if path == "/v1/completions" else chat()[1])
    body.update(model=str(engine.spec.model), stream=True)
    before = interventions(scrape(engine))
    events = []
    with httpx.stream("POST", f"{engine.base_url}{path}", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    assert all("error" not in json.loads(e) for e in events[:-1])
    assert interventions(scrape(engine)) == before
