"""Recording rules: per-instance series the alerts and dashboards read.

Alerts compare these instead of repeating the aggregation, so every alert carries the engine's
identity labels (the mixin config's ``identity_labels``) and nothing else from the raw series
(vLLM's ``model_name``/``engine``, warden's ``gpu``...). Every expression reads the engines'
series through the config's ``select`` and aggregates with its ``by``.
"""

from __future__ import annotations

from alerts.model import RecordingRule, RuleGroup, recorded_name
from exporter.catalog import (
    COLLECTOR_ERRORS,
    ENGINE_RESTARTS,
    MEMORY_RISK,
    MEMORY_WATERMARK_PEAK,
    NONFINITE_LOGITS,
    REQUEST_OUTCOMES,
    REQUEST_RETRIES,
    REQUEST_RETRIES_EXHAUSTED,
    REQUESTS,
    SATURATED,
    TORCH_ALLOCATED,
    TORCH_DEVICE_TOTAL,
    TORCH_RESERVED,
    VLLM_NUM_PREEMPTIONS,
    VLLM_QUEUE_TIME,
    VLLM_REQUEST_SUCCESS,
)

# Not an exported metric: PyTorch's reserved minus allocated bytes, the allocator's cached gap.
TORCH_CACHED_GAP = "warden_torch_cached_bytes"


def outcome(name: str) -> str:
    """A value of the ``outcome`` label of warden_requests_total, checked against the catalog."""
    if name not in REQUEST_OUTCOMES:
        raise ValueError(f"unknown request outcome {name!r}")
    return name


# The memory alerts read the watermark's peak in two layers. The engine's reflex reacts to a
# rising watermark within one step (stops admission, preempts, rejects), so under a persistent
# overload the instantaneous level oscillates: up for a second, back to 0 for a few, up again.
# warden_memory_watermark can then read 0 at every scrape while the engine keeps hitting
# oom_imminent, so the record is not built on it.
# 1. The exporter's warden_memory_watermark_peak is the highest level held at any moment of the
#    last WARDEN_WATERMARK_PEAK_WINDOW_S (15s by default; keep it at least one scrape interval):
#    a spike the reflex absorbs between two scrapes still shows in the next one.
# 2. The max of that gauge over this window stays up while the level keeps coming back at least
#    once per window (recurring pressure), and drops after a single spike the reflex dealt with,
#    one window plus the exporter's peak window after it. The alerts' ``for`` durations are longer
#    than both together, so such a spike never fires them; only recurring pressure does.
# The window must span several scrape intervals (5s in the stack, 15s in the promtool tests) so
# every window holds several samples: a window left with one sample or none by a late or failed
# scrape would drop the peak, or the series, and reset every ``for``.
WATERMARK_PEAK_WINDOW = "1m"
WATERMARK_PEAK = recorded_name(
    "instance", MEMORY_WATERMARK_PEAK, f"max_over_time{WATERMARK_PEAK_WINDOW}"
)
# Memory beyond the engine's plan (exporter/memory_risk.py), worst device per instance and source.
MEMORY_RISK_MAX = recorded_name("instance_source", MEMORY_RISK, "max")
# PyTorch reserved / device total (the eager fallback's "reserved full within 6 h").
TORCH_RESERVED_RATIO = recorded_name("instance_device", TORCH_RESERVED, "ratio")
TORCH_CACHED = recorded_name("instance", TORCH_CACHED_GAP, "max")
TORCH_TOTAL = recorded_name("instance", TORCH_DEVICE_TOTAL, "max")
PREEMPTIONS_RATE = recorded_name("instance", VLLM_NUM_PREEMPTIONS, "rate5m")
FINISHED_RATE = recorded_name("instance", VLLM_REQUEST_SUCCESS, "rate5m")
# Preemptions per finished request: how much work vLLM recomputes, whatever the engine's size.
RECOMPUTE_RATIO = recorded_name("instance", VLLM_NUM_PREEMPTIONS, "per_finished_rate5m")
# vLLM's own measure of the time requests waited in its queue, 90th percentile over 5 minutes.
QUEUE_TIME_P90 = recorded_name("instance", VLLM_QUEUE_TIME, "p90_rate5m")
# Whether admission refused for saturation at any moment of the last minute (warden_saturated is
# held 20 s by the engine; the minute bridges scrapes).
SATURATED_1M = recorded_name("instance", SATURATED, "max_over_time1m")
REQUESTS_BY_OUTCOME_RATE = recorded_name("instance_outcome", REQUESTS, "rate5m")
# Requests that reached the engine: everything except what admission control refused.
REQUESTS_SERVED_RATE = recorded_name("instance", REQUESTS, "served_rate5m")
SERVER_ERROR_RATIO = recorded_name("instance", REQUESTS, "server_error_ratio_rate5m")
# Share of requests admission refused (every reason): what an overload costs the clients.
REJECTED_RATIO = recorded_name("instance", REQUESTS, "rejected_ratio_rate5m")
RETRIES_RATIO = recorded_name("instance", REQUEST_RETRIES, "ratio_rate5m")
RETRIES_EXHAUSTED_RATIO = recorded_name("instance", REQUEST_RETRIES_EXHAUSTED, "ratio_rate5m")
NONFINITE_RATE = recorded_name("instance", NONFINITE_LOGITS, "rate5m")
NONFINITE_RATIO = recorded_name("instance", NONFINITE_LOGITS, "ratio_rate5m")
RESTARTS_1H = recorded_name("instance", ENGINE_RESTARTS, "increase1h")
COLLECTOR_ERRORS_RATE = recorded_name("instance_collector", COLLECTOR_ERRORS, "rate5m")

_REJECTED = outcome("rejected")
_SERVER_ERROR = outcome("server_error")

RECORDING_RULES = RuleGroup(
    "warden-recording",
    (
        RecordingRule(
            WATERMARK_PEAK,
            lambda c: (
                f"max {c.by()} "
                f"(max_over_time({c.select(MEMORY_WATERMARK_PEAK)}[{WATERMARK_PEAK_WINDOW}]))"
            ),
        ),
        RecordingRule(MEMORY_RISK_MAX, lambda c: f"max {c.by('source')} ({c.select(MEMORY_RISK)})"),
        RecordingRule(
            TORCH_RESERVED_RATIO,
            lambda c: (
                f"sum {c.by('device')} ({c.select(TORCH_RESERVED)})\n"
                f"/\n"
                f"sum {c.by('device')} ({c.select(TORCH_DEVICE_TOTAL)})"
            ),
        ),
        RecordingRule(
            TORCH_CACHED,
            lambda c: f"max {c.by()} ({c.select(TORCH_RESERVED)} - {c.select(TORCH_ALLOCATED)})",
        ),
        RecordingRule(TORCH_TOTAL, lambda c: f"max {c.by()} ({c.select(TORCH_DEVICE_TOTAL)})"),
        RecordingRule(
            PREEMPTIONS_RATE,
            lambda c: f"sum {c.by()} (rate({c.select(VLLM_NUM_PREEMPTIONS)}[5m]))",
        ),
        RecordingRule(
            FINISHED_RATE,
            lambda c: f"sum {c.by()} (rate({c.select(VLLM_REQUEST_SUCCESS)}[5m]))",
        ),
        RecordingRule(RECOMPUTE_RATIO, f"{PREEMPTIONS_RATE}\n/\n{FINISHED_RATE}"),
        RecordingRule(
            QUEUE_TIME_P90,
            lambda c: (
                f"histogram_quantile(\n  0.9,\n  sum {c.by('le')} "
                f"(rate({c.select(VLLM_QUEUE_TIME.name + '_bucket')}[5m]))\n)"
            ),
        ),
        RecordingRule(
            SATURATED_1M,
            lambda c: f"max {c.by()} (max_over_time({c.select(SATURATED)}[1m]))",
        ),
        RecordingRule(
            REQUESTS_BY_OUTCOME_RATE,
            lambda c: f"sum {c.by('outcome')} (rate({c.select(REQUESTS)}[5m]))",
        ),
        RecordingRule(
            REQUESTS_SERVED_RATE,
            lambda c: f'sum {c.by()} ({REQUESTS_BY_OUTCOME_RATE}{{outcome!="{_REJECTED}"}})',
        ),
        RecordingRule(
            SERVER_ERROR_RATIO,
            lambda c: (
                f'sum {c.by()} ({REQUESTS_BY_OUTCOME_RATE}{{outcome="{_SERVER_ERROR}"}})\n'
                f"/\n"
                f"{REQUESTS_SERVED_RATE}"
            ),
        ),
        RecordingRule(
            REJECTED_RATIO,
            lambda c: (
                f'sum {c.by()} ({REQUESTS_BY_OUTCOME_RATE}{{outcome="{_REJECTED}"}})\n'
                f"/\n"
                f"sum {c.by()} ({REQUESTS_BY_OUTCOME_RATE})"
            ),
        ),
        RecordingRule(
            RETRIES_RATIO,
            lambda c: (
                f"sum {c.by()} (rate({c.select(REQUEST_RETRIES)}[5m]))\n/\n{REQUESTS_SERVED_RATE}"
            ),
        ),
        RecordingRule(
            RETRIES_EXHAUSTED_RATIO,
            lambda c: (
                f"sum {c.by()} (rate({c.select(REQUEST_RETRIES_EXHAUSTED)}[5m]))\n"
                f"/\n"
                f"{REQUESTS_SERVED_RATE}"
            ),
        ),
        RecordingRule(
            NONFINITE_RATE, lambda c: f"sum {c.by()} (rate({c.select(NONFINITE_LOGITS)}[5m]))"
        ),
        RecordingRule(NONFINITE_RATIO, f"{NONFINITE_RATE}\n/\n{REQUESTS_SERVED_RATE}"),
        RecordingRule(
            RESTARTS_1H, lambda c: f"sum {c.by()} (increase({c.select(ENGINE_RESTARTS)}[1h]))"
        ),
        RecordingRule(
            COLLECTOR_ERRORS_RATE,
            lambda c: f"sum {c.by('collector')} (rate({c.select(COLLECTOR_ERRORS)}[5m]))",
        ),
    ),
)
