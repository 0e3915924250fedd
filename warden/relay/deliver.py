"""One POST per engine, with the fleet's bearer token and a bounded number of retries.

The engines' webhook is idempotent (leases keyed by fingerprint and startsAt), so a retry, or
Alertmanager resending the whole notification after the relay answered 5xx, is harmless.
Retried: connection errors, timeouts and 5xx (the engine's "try again"). Not retried: 4xx (a
wrong token or a payload the engine refuses will not change). All deliveries run concurrently
and the whole round stays inside ``deadline_s``, well inside the time Alertmanager gives one
notification (its group interval, at least 10 s), so the relay answers before Alertmanager
gives up on it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from exporter import catalog
from warden.common import tokens
from warden.control.config import RetrySettings
from warden.control.retry import backoff_s

DELIVERED, RETRIED, FAILED, REFUSED = catalog.RELAY_DELIVERY_OUTCOMES


@dataclass(frozen=True)
class DeliveryPolicy:
    attempts: int = 3
    attempt_timeout_s: float = 2.0
    deadline_s: float = 6.0
    backoff_base_s: float = 0.2
    backoff_max_s: float = 1.0

    def backoff(self, attempt: int, rng: random.Random) -> float:
        settings = RetrySettings(
            max_attempts=self.attempts,
            backoff_base_s=self.backoff_base_s,
            backoff_max_s=self.backoff_max_s,
        )
        return backoff_s(settings, attempt, rng)


@dataclass(frozen=True)
class Delivery:
    """What became of one engine's notification."""

    url: str
    alerts: int
    outcome: str  # delivered | failed | refused
    attempts: int
    status: int | None
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "engine": self.url,
            "alerts": self.alerts,
            "outcome": self.outcome,
            "attempts": self.attempts,
            "status": self.status,
            "detail": self.detail,
        }


async def deliver(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    alerts: int,
    token: str | None,
    policy: DeliveryPolicy,
    on_retry: Callable[[], None] = lambda: None,
    rng: random.Random | None = None,
) -> Delivery:
    """POST ``body`` to one engine's webhook until it answers or the policy runs out."""
    rng = rng or random.Random()
    headers: Mapping[str, str] = {
        "Content-Type": "application/json",
        **(tokens.bearer_header(token) if token else {}),
    }
    give_up_at = time.monotonic() + policy.deadline_s
    status: int | None = None
    detail = ""
    attempt = 0
    while attempt < policy.attempts:
        attempt += 1
        remaining = give_up_at - time.monotonic()
        if remaining <= 0:
            break
        try:
            response = await client.post(
                url, content=body, headers=headers, timeout=min(policy.attempt_timeout_s, remaining)
            )
            status, detail = response.status_code, response.text[:300]
        except httpx.HTTPError as exc:
            status, detail = None, f"{type(exc).__name__}: {exc}"
        if status is not None and 200 <= status < 300:
            return Delivery(url, alerts, DELIVERED, attempt, status)
        if status is not None and 400 <= status < 500:
            return Delivery(url, alerts, REFUSED, attempt, status, detail)
        if attempt >= policy.attempts:
            break
        pause = policy.backoff(attempt + 1, rng)
        if time.monotonic() + pause >= give_up_at:
            break
        on_retry()
        await asyncio.sleep(pause)
    return Delivery(url, alerts, FAILED, attempt, status, detail)
