"""When and how warden retries a request: transient failures only, backoff with jitter."""

from __future__ import annotations

import random

from exporter.catalog import RETRY_REASONS
from warden.control.config import RetrySettings

# Reasons (label values of warden_request_retries_total).
WARDEN_PREEMPTION, ENGINE_OOM, NONFINITE_LOGITS, TIMEOUT = RETRY_REASONS
TRANSIENT_REASONS = RETRY_REASONS
# Not a retry reason: the request's own constraints masked every token (never retried).
ALL_TOKENS_MASKED = "all_tokens_masked"
ALL_TOKENS_MASKED_MESSAGE = (
    "every token was masked by this request's own constraints (allowed_token_ids, bad_words, "
    "logit_bias, or a structured-output grammar that admits nothing): nothing can be generated"
)


def classify_failure(status: int, body: bytes, preempted: bool, nonfinite: bool) -> str | None:
    """The retry reason for this attempt's outcome, or None when it must not be retried."""
    if preempted:
        return WARDEN_PREEMPTION
    if nonfinite:
        return NONFINITE_LOGITS
    if status in (408, 504):
        return TIMEOUT
    if status >= 500:
        text = body[:4096].lower()
        if b"out of memory" in text or b"outofmemory" in text:
            return ENGINE_OOM
    return None  # success, or invalid input (4xx): never retried


def backoff_s(settings: RetrySettings, attempt: int, rng: random.Random | None = None) -> float:
    """Full-jitter exponential backoff before attempt ``attempt`` (2, 3, ...)."""
    ceiling = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** max(attempt - 2, 0))
    return (rng or random).uniform(0, ceiling)
