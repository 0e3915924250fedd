"""The one rule for what became of a request: completed, refused or failed."""

from __future__ import annotations

import json

import pytest

from warden.common.outcomes import COMPLETED, FAILED, REFUSED, OutcomeTally, classify


def error(reason: str) -> bytes:
    return json.dumps({"error": {"message": "x", "warden_reason": reason}}).encode()


@pytest.mark.parametrize(
    ("status", "headers", "body", "stream", "expected"),
    [
        (200, {}, b"{}", False, COMPLETED),
        (200, {}, b"data: {}\n\ndata: [DONE]\n\n", True, COMPLETED),
        (200, {}, b"data: {}\n\n", True, FAILED),  # cut short
        (200, {}, b'data: {"error": {"message": "x"}}\n\ndata: [DONE]\n\n', True, FAILED),
        (503, {"Retry-After": "5"}, error("reject_all"), False, REFUSED),
        (429, {"retry-after": "2"}, error("kv_headroom"), False, REFUSED),
        (503, {"Retry-After": "5"}, b'{"error": "queue full"}', False, REFUSED),  # vLLM's own
        (503, {}, error("reject_all"), False, FAILED),  # no Retry-After: not a clean refusal
        (503, {"Retry-After": "5"}, error("warden_preemption"), False, FAILED),  # retries spent
        (503, {"Retry-After": "5"}, error("engine_oom"), False, FAILED),
        (500, {}, error("nonfinite_logits"), False, FAILED),
        (400, {}, b"{}", False, FAILED),
        (None, {}, None, False, FAILED),  # no answer at all
    ],
)
def test_classify(
    status: int | None, headers: dict, body: bytes | None, stream: bool, expected: str
) -> None:
    assert classify(status, headers, body, stream) == expected


def test_tally_names_every_outcome() -> None:
    tally = OutcomeTally()
    tally.add(COMPLETED)
    tally.add(FAILED, "503 warden_preemption")
    assert tally.line() == "completed: 1, refused: 0, failed: 1"
    assert tally.failures == ["503 warden_preemption"] and tally.total == 2
