"""What became of a request, told honestly: completed, refused or failed.

Every figure warden claims about requests (the demo, ``warden chaos``, the benchmarks, the
tests) counts with this one rule:

- ``completed``: the server answered 2xx and the answer is whole (a stream ended with
  ``data: [DONE]`` and carried no error event).
- ``refused``: warden or vLLM said no *before doing any work*, with a 429/503 and a
  ``Retry-After`` header: the client may simply come back later.
- ``failed``: anything else: a 5xx, a 4xx other than those refusals, a broken connection, a
  stream that ended in an error event, and a 503 after warden spent its retries (its body
  names a retry reason such as ``warden_preemption``): work was done and lost.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.catalog import RETRY_REASONS

COMPLETED, REFUSED, FAILED = "completed", "refused", "failed"
OUTCOMES: tuple[str, ...] = (COMPLETED, REFUSED, FAILED)
REFUSAL_STATUSES = frozenset({429, 503})


def warden_reason(body: bytes | str | Mapping[str, Any] | None) -> str | None:
    """The ``error.warden_reason`` of a JSON error body, if any."""
    data: Any = body
    if isinstance(body, bytes | str):
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
    if not isinstance(data, Mapping):
        return None
    error = data.get("error")
    reason = error.get("warden_reason") if isinstance(error, Mapping) else None
    return reason if isinstance(reason, str) else None


def stream_failed(text: str) -> bool:
    """Whether an SSE stream lacks its ``[DONE]`` or carries an error event."""
    if "data: [DONE]" not in text:
        return True
    for line in text.splitlines():
        if line.startswith("data: {") and '"error"' in line:
            try:
                event = json.loads(line[len("data: ") :])
            except ValueError:
                continue
            if isinstance(event, dict) and "error" in event:
                return True
    return False


def classify(
    status: int | None,
    headers: Mapping[str, str] | None = None,
    body: bytes | str | Mapping[str, Any] | None = None,
    stream: bool = False,
) -> str:
    """completed / refused / failed for one answer (``status`` None: no answer at all)."""
    if status is None:
        return FAILED
    if 200 <= status < 300:
        if stream:
            text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
            return FAILED if stream_failed(text) else COMPLETED
        return COMPLETED
    retry_after = {k.lower(): v for k, v in (headers or {}).items()}.get("retry-after")
    if status in REFUSAL_STATUSES and retry_after:
        return FAILED if warden_reason(body) in RETRY_REASONS else REFUSED
    return FAILED


@dataclass
class OutcomeTally:
    """Counts of each outcome, and a few examples of failures to print."""

    counts: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    keep_failures: int = 20

    def add(self, outcome: str, detail: str = "") -> None:
        self.counts[outcome] += 1
        if outcome == FAILED and len(self.failures) < self.keep_failures:
            self.failures.append(detail)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def line(self) -> str:
        """``completed: N, refused: N, failed: N``, every outcome named even when 0."""
        return ", ".join(f"{name}: {self.counts.get(name, 0)}" for name in OUTCOMES)
