"""The recording rules: what each records from realistic input.

Expected labels and descriptions are spelled out by hand, so they check the rules instead of
echoing them.
"""

from __future__ import annotations

from alerts import recording as rec
from exporter.catalog import (
    COLLECTOR_ERRORS,
    ENGINE_RESTARTS,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    MEMORY_RISK,
    NONFINITE_LOGITS,
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
from tests.promtool.memory import LEVEL, PEAK
from tests.promtool.model import (
    ExprCheck,
    RecordingScenario,
    Sample,
    series_text,
)
from tests.promtool.series import (
    GIB,
    INSTANCE,
    s,
)


def at(record: str, value: float, **extra: str) -> Sample:
    """A recorded sample of the engine instance."""
    return Sample(series_text(record, {"instance": INSTANCE, **extra}), value)


RECORDING_SCENARIOS = (
    RecordingScenario(
        "memory watermark: the peak over the last minute",
        # 15s samples of the peak gauge: 0 until 2m, 3 at 2m15s, 1 at 3m30s, else 0; the current
        # level is 0 at every scrape (the reflex absorbed both spikes between scrapes)
        {LEVEL: "0x25", PEAK: "0x8 3 0x3 1 0x10"},
        (
            ExprCheck("2m", rec.WATERMARK_PEAK, (at(rec.WATERMARK_PEAK, 0),)),
            # the peak gauge reads 0; it showed 3 45s ago
            ExprCheck("3m", rec.WATERMARK_PEAK, (at(rec.WATERMARK_PEAK, 3),)),
            # the 3 is over a minute old; the gauge showed 1 30s ago
            ExprCheck("4m", rec.WATERMARK_PEAK, (at(rec.WATERMARK_PEAK, 1),)),
            ExprCheck("5m", rec.WATERMARK_PEAK, (at(rec.WATERMARK_PEAK, 0),)),
        ),
        interval="15s",
    ),
    RecordingScenario(
        "memory: one instance with two GPUs",
        {
            s(GPU_MEMORY_USED, gpu="0"): f"{40 * GIB}x4",
            s(GPU_MEMORY_TOTAL, gpu="0"): f"{80 * GIB}x4",
            s(GPU_MEMORY_USED, gpu="1"): f"{60 * GIB}x4",
            s(GPU_MEMORY_TOTAL, gpu="1"): f"{80 * GIB}x4",
            s(TORCH_RESERVED, device="cuda:0"): f"{36 * GIB}x4",
            s(TORCH_ALLOCATED, device="cuda:0"): f"{30 * GIB}x4",
            s(TORCH_DEVICE_TOTAL, device="cuda:0"): f"{80 * GIB}x4",
            s(TORCH_RESERVED, device="cuda:1"): f"{50 * GIB}x4",
            s(TORCH_ALLOCATED, device="cuda:1"): f"{48 * GIB}x4",
            s(TORCH_DEVICE_TOTAL, device="cuda:1"): f"{80 * GIB}x4",
        },
        (
            ExprCheck(
                "1m",
                rec.TORCH_RESERVED_RATIO,
                (
                    at(rec.TORCH_RESERVED_RATIO, 0.45, device="cuda:0"),
                    at(rec.TORCH_RESERVED_RATIO, 0.625, device="cuda:1"),
                ),
            ),
            # the larger gap: 6 GiB on cuda:0 (2 GiB on cuda:1)
            ExprCheck("1m", rec.TORCH_CACHED, (at(rec.TORCH_CACHED, 6 * GIB),)),
            ExprCheck("1m", rec.TORCH_TOTAL, (at(rec.TORCH_TOTAL, 80 * GIB),)),
        ),
    ),
    RecordingScenario(
        "traffic: two engines, requests by outcome",
        {
            s(VLLM_NUM_PREEMPTIONS, engine="0"): "0+30x10",
            s(VLLM_NUM_PREEMPTIONS, engine="1"): "0+90x10",
            s(REQUESTS, outcome="success"): "0+540x10",
            s(REQUESTS, outcome="client_error"): "0+60x10",
            s(REQUESTS, outcome="server_error"): "0+120x10",
            s(REQUESTS, outcome="rejected"): "0+600x10",
            s(REQUEST_RETRIES, reason="oom"): "0+45x10",
            s(REQUEST_RETRIES, reason="cuda_driver"): "0+45x10",
            s(REQUEST_RETRIES_EXHAUSTED, reason="oom"): "0+22.5x10",
            s(NONFINITE_LOGITS, kind="nan"): "0+6x10",
            s(NONFINITE_LOGITS, kind="inf"): "0+1.2x10",
        },
        (
            # (30 + 90) a minute
            ExprCheck("10m", rec.PREEMPTIONS_RATE, (at(rec.PREEMPTIONS_RATE, 2),)),
            ExprCheck(
                "10m",
                rec.REQUESTS_BY_OUTCOME_RATE,
                (
                    at(rec.REQUESTS_BY_OUTCOME_RATE, 1, outcome="client_error"),
                    at(rec.REQUESTS_BY_OUTCOME_RATE, 10, outcome="rejected"),
                    at(rec.REQUESTS_BY_OUTCOME_RATE, 2, outcome="server_error"),
                    at(rec.REQUESTS_BY_OUTCOME_RATE, 9, outcome="success"),
                ),
            ),
            # served: everything but the rejected, 12 a second
            ExprCheck("10m", rec.REQUESTS_SERVED_RATE, (at(rec.REQUESTS_SERVED_RATE, 12),)),
            ExprCheck("10m", rec.SERVER_ERROR_RATIO, (at(rec.SERVER_ERROR_RATIO, 2 / 12),)),
            # ratios with exact binary fractions: promtool compares values exactly
            ExprCheck("10m", rec.RETRIES_RATIO, (at(rec.RETRIES_RATIO, 0.125),)),
            ExprCheck(
                "10m", rec.RETRIES_EXHAUSTED_RATIO, (at(rec.RETRIES_EXHAUSTED_RATIO, 0.03125),)
            ),
            ExprCheck("10m", rec.NONFINITE_RATE, (at(rec.NONFINITE_RATE, 0.12),)),
            ExprCheck("10m", rec.NONFINITE_RATIO, (at(rec.NONFINITE_RATIO, 0.01),)),
        ),
    ),
    RecordingScenario(
        "saturation and memory risk",
        {
            s(MEMORY_RISK, source="device"): "0.25x10",
            s(MEMORY_RISK, source="allocator"): "0.5x10",
            s(VLLM_REQUEST_SUCCESS, finished_reason="stop"): "0+30x10",
            s(VLLM_REQUEST_SUCCESS, finished_reason="length"): "0+30x10",
            # 15 preemptions a minute on each of two engines
            s(VLLM_NUM_PREEMPTIONS, engine="0"): "0+15x10",
            s(VLLM_NUM_PREEMPTIONS, engine="1"): "0+15x10",
            # 60 requests a minute, every one waiting between 10 s and 60 s
            s(f"{VLLM_QUEUE_TIME.name}_bucket", le="1"): "0x10",
            s(f"{VLLM_QUEUE_TIME.name}_bucket", le="10"): "0x10",
            s(f"{VLLM_QUEUE_TIME.name}_bucket", le="60"): "0+60x10",
            s(f"{VLLM_QUEUE_TIME.name}_bucket", le="+Inf"): "0+60x10",
            # saturated once, at 8m, for one scrape
            s(SATURATED): "0x7 1 0x2",
            s(REQUESTS, outcome="success"): "0+60x10",
            s(REQUESTS, outcome="rejected"): "0+20x10",
        },
        (
            ExprCheck(
                "10m",
                rec.MEMORY_RISK_MAX,
                (
                    at(rec.MEMORY_RISK_MAX, 0.5, source="allocator"),
                    at(rec.MEMORY_RISK_MAX, 0.25, source="device"),
                ),
            ),
            ExprCheck("10m", rec.FINISHED_RATE, (at(rec.FINISHED_RATE, 1),)),
            # 30 preemptions for 60 finished a minute
            ExprCheck("10m", rec.RECOMPUTE_RATIO, (at(rec.RECOMPUTE_RATIO, 0.5),)),
            # p90 inside the (10, 60] bucket: 10 + 50 * 0.9
            ExprCheck("10m", rec.QUEUE_TIME_P90, (at(rec.QUEUE_TIME_P90, 55),)),
            ExprCheck("7m", rec.SATURATED_1M, (at(rec.SATURATED_1M, 0),)),
            ExprCheck("9m", rec.SATURATED_1M, (at(rec.SATURATED_1M, 1),)),
            ExprCheck("10m", rec.SATURATED_1M, (at(rec.SATURATED_1M, 0),)),
            # 20 refused of 80 a minute
            ExprCheck("10m", rec.REJECTED_RATIO, (at(rec.REJECTED_RATIO, 0.25),)),
        ),
    ),
    RecordingScenario(
        "liveness: restarts and collector errors",
        {
            s(ENGINE_RESTARTS, reason="crash"): "0+1x90",
            s(ENGINE_RESTARTS, reason="stalled"): "0x90",
            s(COLLECTOR_ERRORS, collector="nvml"): "0+6x90",
            s(COLLECTOR_ERRORS, collector="cudagraph"): "0x90",
        },
        (
            ExprCheck("90m", rec.RESTARTS_1H, (at(rec.RESTARTS_1H, 60),)),
            ExprCheck(
                "90m",
                rec.COLLECTOR_ERRORS_RATE,
                (
                    at(rec.COLLECTOR_ERRORS_RATE, 0, collector="cudagraph"),
                    at(rec.COLLECTOR_ERRORS_RATE, 0.1, collector="nvml"),
                ),
            ),
        ),
    ),
)
