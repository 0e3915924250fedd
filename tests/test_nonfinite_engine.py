"""Real NaN logits from a real model: the tiny model built with ``--nan-token`` on a vLLM CPU engine
with every warden hook and no test switch (issue 10, item 1).

A prompt holding the poisoned token makes the model's own weights produce NaN logits on every
step and every retry: warden counts each attempt, contains the row (the request ends on that
step with end-of-sequence), flags it before the response leaves, retries, and ends with a clear
500. Requests without the token, in the same batch and after, are answered normally.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from exporter import catalog
from tests.support.engine import complete, sample, scrape
from warden.common.tinymodel import STACK_NAN_TOKEN, nan_token_of
from warden.stack import chaos
from warden.supervisor.engine import EngineProcess

pytestmark = pytest.mark.engine

NAN_TOKEN = STACK_NAN_TOKEN  # <unk>: never produced from text, never generated
ATTEMPTS = 3  # warden's default retry.max_attempts


@pytest.fixture
def engine(plain_engine: EngineProcess) -> EngineProcess:
    """The session's plain engine (tests/support/shared_engine.py): the stack's tiny model,
    whose token NAN_TOKEN makes NaN logits, with warden's default settings."""
    return plain_engine


def model(engine: EngineProcess) -> str:
    return str(engine.spec.model)


def prompt_ids(engine: EngineProcess, poisoned: bool) -> list[int]:
    answer = httpx.post(
        f"{engine.base_url}/tokenize",
        json={"model": model(engine), "prompt": "memory cache block engine request token"},
        timeout=30,
    ).json()
    ids = [int(t) for t in answer["tokens"]]
    return [*ids[:3], NAN_TOKEN, *ids[3:]] if poisoned else ids


def complete_ids(engine: EngineProcess, ids: list[int], **body: object) -> httpx.Response:
    payload = {"model": model(engine), "prompt": ids, "max_tokens": 16, **body}
    return httpx.post(f"{engine.base_url}/v1/completions", json=payload, timeout=120)


def delta(before: dict[str, float], after: dict[str, float], name: str, **labels: str) -> float:
    return sample(after, name, **labels) - sample(before, name, **labels)


def test_the_model_records_its_nan_token(engine: EngineProcess) -> None:
    assert nan_token_of(model(engine)) == NAN_TOKEN


def test_a_plain_engine_has_no_test_switch_and_no_open_webhook(engine: EngineProcess) -> None:
    """Defaults: the poisoning switch is off unless its env var enables it, and without a
    token the Alertmanager webhook is disabled (403) while requests are served."""
    webhook = httpx.post(
        f"{engine.base_url}/warden/alertmanager",
        json={"version": "4", "status": "firing", "alerts": []},
    )
    assert webhook.status_code == 403 and "disabled" in webhook.text
    before = scrape(engine)
    complete(
        engine, model(engine), "cache block", 8, vllm_xargs={"warden_inject": "nan"}
    ).raise_for_status()
    assert delta(before, scrape(engine), catalog.NONFINITE_LOGITS.name) == 0.0


def test_real_nan_on_every_attempt_ends_in_a_clear_error(engine: EngineProcess) -> None:
    """The poisoned step is the request's last (contained to end-of-sequence): it is flagged
    before the response leaves, each attempt is counted, and the client gets a clear 500."""
    before = scrape(engine)
    response = complete_ids(engine, prompt_ids(engine, poisoned=True))
    assert response.status_code == 500, response.text[:300]
    error = response.json()["error"]
    assert error["warden_reason"] == "nonfinite_logits" and "non-finite" in error["message"]
    after = scrape(engine)
    assert delta(before, after, catalog.NONFINITE_LOGITS.name, kind="nan") == ATTEMPTS
    assert delta(before, after, catalog.NONFINITE_LOGITS.name, kind="inf") == 0
    retried = delta(before, after, catalog.REQUEST_RETRIES.name, reason="nonfinite_logits")
    exhausted = delta(
        before, after, catalog.REQUEST_RETRIES_EXHAUSTED.name, reason="nonfinite_logits"
    )
    assert (retried, exhausted) == (ATTEMPTS - 1, 1)
    # Every attempt's response went through the flag check (no wait on a CPU engine).
    waits = delta(before, after, f"{catalog.NONFINITE_FLAG_WAIT.name}_count")
    assert waits >= ATTEMPTS


def test_healthy_requests_beside_and_after_a_poisoned_one_are_untouched(
    engine: EngineProcess,
) -> None:
    healthy, poisoned = prompt_ids(engine, poisoned=False), prompt_ids(engine, poisoned=True)
    before = scrape(engine)
    with ThreadPoolExecutor(4) as pool:
        clean = [
            pool.submit(complete_ids, engine, healthy, max_tokens=24, ignore_eos=True)
            for _ in range(3)
        ]
        bad = pool.submit(complete_ids, engine, poisoned)
        answers = [f.result() for f in clean]
        assert bad.result().status_code == 500
    for answer in answers:
        assert answer.status_code == 200
        assert answer.json()["usage"]["completion_tokens"] == 24  # never contained
    after = scrape(engine)
    assert delta(before, after, catalog.NONFINITE_LOGITS.name, kind="nan") == ATTEMPTS
    # The poisoned request's KV blocks go back to the pool: later requests reuse them cleanly.
    again = complete_ids(engine, healthy, max_tokens=24, ignore_eos=True)
    assert again.status_code == 200
    assert delta(after, scrape(engine), catalog.NONFINITE_LOGITS.name, kind="nan") == 0


def test_a_poisoned_stream_ends_with_an_error_event(engine: EngineProcess) -> None:
    body = {
        "model": model(engine),
        "prompt": prompt_ids(engine, poisoned=True),
        "max_tokens": 16,
        "stream": True,
    }
    response = httpx.post(f"{engine.base_url}/v1/completions", json=body, timeout=120)
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and '"error"' in e]
    if response.status_code == 200:
        assert errors and errors[-1]["warden_reason"] == "nonfinite_logits", events
    else:
        assert response.json()["error"]["warden_reason"] == "nonfinite_logits"


def test_chaos_nan_sends_the_models_nan_token_and_sees_it_counted(engine: EngineProcess) -> None:
    parser = argparse.ArgumentParser()
    chaos.add_arguments(parser)
    args = parser.parse_args(["nan", "--engine-url", engine.base_url, "--count", "2"])
    lines: list[str] = []
    assert chaos.run(args, out=lines.append) == 0
    text = "\n".join(lines)
    assert f"token {NAN_TOKEN} in the prompt" in text
    assert "2 requests: completed: 0, refused: 0, failed: 2" in text
    counted = [line for line in lines if "went from" in line]
    assert counted, text
    low, high = (float(v) for v in counted[0].rsplit(" ", 3)[1::2])
    assert high - low == 2 * ATTEMPTS


def single_token_word(engine: EngineProcess) -> tuple[str, list[int]]:
    """A word that is one token both alone and after a space (what bad_words bans), and its
    token ids."""

    def ids(text: str) -> list[int]:
        answer = httpx.post(
            f"{engine.base_url}/tokenize",
            json={"model": model(engine), "prompt": text, "add_special_tokens": False},
            timeout=30,
        ).json()
        return [int(t) for t in answer["tokens"]]

    for word in ("memory", "cache", "block", "engine", "request", "token", "the", "a"):
        alone, spaced = ids(word), ids(" " + word)
        if len(alone) == 1 and len(spaced) == 1:
            return word, sorted({*alone, *spaced})
    pytest.fail("no word of the tiny model's vocabulary is a single token alone and spaced")


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "stream"])
def test_a_request_whose_constraints_mask_every_token_gets_a_clear_error(
    engine: EngineProcess, stream: bool
) -> None:
    """allowed_token_ids that bad_words bans entirely: vLLM leaves no token to sample (every
    logit -inf). That is the request's own constraint, not the model's fault: a clear 400 that
    names it (an error event on a stream that already started), no non-finite count, no retry."""
    word, allowed = single_token_word(engine)
    before = scrape(engine)
    body = {
        "model": model(engine),
        "prompt": prompt_ids(engine, poisoned=False),
        "max_tokens": 8,
        "allowed_token_ids": allowed,
        "bad_words": [word],
        "stream": stream,
    }
    response = httpx.post(f"{engine.base_url}/v1/completions", json=body, timeout=120)
    if stream and response.status_code == 200:
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and '"error"' in e]
        assert errors, events
        error = errors[-1]
    else:
        assert response.status_code == 400, response.text[:300]
        error = response.json()["error"]
    assert error["warden_reason"] == "all_tokens_masked" and error["code"] == 400
    assert "allowed_token_ids" in error["message"] and "bad_words" in error["message"]
    after = scrape(engine)
    for kind in catalog.NONFINITE_KINDS:
        assert delta(before, after, catalog.NONFINITE_LOGITS.name, kind=kind) == 0
    for reason in catalog.RETRY_REASONS:
        assert delta(before, after, catalog.REQUEST_RETRIES.name, reason=reason) == 0
    # The same prompt without the contradiction is served as ever.
    assert complete_ids(engine, prompt_ids(engine, poisoned=False)).status_code == 200
