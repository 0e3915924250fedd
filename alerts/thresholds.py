"""Every per-deployment threshold and hold of the alerting rules, with its default and why.

Like the monitoring mixins' ``_config``: the rules in ``alerts/rules.py`` and ``alerts/fleet.py``
read these instead of constants, so a deployment changes one in its mixin config
(``thresholds:`` in the file ``warden generate --config`` reads) and regenerates, instead of
editing rules. Each value is validated here: a ratio lies in (0, 1), a rate or a count is
positive, a hold is a Prometheus duration longer than zero.

Defaults are written as the rules have always rendered them (``60``, ``1.0``), so the rules
generated from the default config stay byte-identical.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from alerts.durations import positive_duration
from exporter.catalog import VLLM_E2E_LATENCY

# A share of something, strictly between none and all.
Ratio = Annotated[float, Field(gt=0, lt=1)]
# A rate, a size or a time: above zero.
Positive = Annotated[float, Field(gt=0)]
# How long a condition must hold (``for``) or an alert keeps firing (``keep_firing_for``).
Duration = Annotated[str, AfterValidator(positive_duration)]


class Thresholds(BaseModel):
    """Thresholds and holds a deployment may change without editing rules."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # --- Memory watermark: how long the peak level must be seen. Each must be longer than the
    # peak's window plus the exporter's peak window (1m15s), or one spike the engine's reflex
    # handled would fire it (alerts/rules.py explains).
    watermark_high_for: Duration = "2m"
    watermark_critical_for: Duration = "2m"
    oom_imminent_for: Duration = "90s"

    # --- Memory creep (WardenTimeToOOM, WardenAllocatorCacheGrowth, the eager fallback).
    # The lowest memory risk over the trend's window: some of the margin must have been used
    # all along, not a blip.
    time_to_oom_floor: Ratio = 0.05
    time_to_oom_warning_for: Duration = "30m"
    time_to_oom_critical_for: Duration = "10m"
    # The 10-minute rule: lowest risk over its last 30 s, and its hold.
    time_to_oom_fast_floor: Ratio = 0.05
    time_to_oom_fast_for: Duration = "1m"
    # Allocator cache (reserved - allocated) growth that counts as a leak, and the share of the
    # device the cache must already hold for it to matter.
    cache_growth_bytes_per_hour: Annotated[int, Field(gt=0)] = 256 * 2**20
    cache_gap_floor_ratio: Ratio = 0.05
    allocator_cache_growth_for: Duration = "1h"
    # How long PyTorch memory creeps on an engine with CUDA graphs before it restarts eager.
    eager_fallback_for: Duration = "30m"

    # --- Traffic and saturation.
    # The critical WardenSaturated (pages): the share of requests refused over 5 minutes above
    # which the service is failing most of its users. Not a property of the machine: the demo
    # calibrates its load so that it lands above this on any machine (warden/cli/scenario.py).
    saturated_refused_ratio: Ratio = 0.5
    saturated_for: Duration = "1m"
    saturated_critical_for: Duration = "2m"
    saturated_keep_firing_for: Duration = "2m"
    # 90th percentile of vLLM's queue time, for engines without a latency SLO.
    queue_time_p90_seconds: Positive = 60
    queue_wait_for: Duration = "15m"
    # Preemptions per finished request above which recomputation eats the throughput.
    recompute_per_finished: Positive = 1.0
    preemption_storm_for: Duration = "15m"
    # Ratio alerts need some traffic, or one failed request out of two is "50% errors".
    min_served_per_second: Positive = 0.05
    # Server errors among requests served: the breaker half opens, then opens.
    error_ratio_half_open: Ratio = 0.2
    error_ratio_open: Ratio = 0.5
    error_half_open_for: Duration = "2m"
    error_half_open_keep_firing_for: Duration = "10m"
    error_open_for: Duration = "1m"
    error_open_keep_firing_for: Duration = "5m"

    # --- Faults.
    # Share of requests with non-finite logits that points at the weights or the device, and
    # how long a trickle may last before it counts as sustained.
    nonfinite_for: Duration = "1m"
    nonfinite_widespread_ratio: Ratio = 0.01
    nonfinite_sustained: Duration = "30m"
    nonfinite_critical_for: Duration = "5m"
    # Retries, and retries that still failed, as a share of requests served.
    retry_ratio: Ratio = 0.1
    retry_for: Duration = "10m"
    retry_exhausted_ratio: Ratio = 0.05
    retry_exhausted_for: Duration = "5m"
    collector_error_for: Duration = "10m"

    # --- Liveness.
    engine_stalled_for: Duration = "1m"
    engine_down_for: Duration = "2m"
    restarts_per_hour: Annotated[int, Field(gt=0)] = 5
    restart_loop_for: Duration = "1m"
    # Longer than a normal restart.
    engine_unhealthy_for: Duration = "5m"

    # --- Fleet.
    # WardenFleetDegraded: share of a job's engines degraded or unreachable.
    fleet_degraded_ratio: float = Field(0.5, gt=0, le=1)
    fleet_degraded_for: Duration = "5m"
    # SLO attainment: share of requests finished within this (a bucket of vLLM's e2e latency).
    latency_slo_seconds: float = 10.0

    @field_validator("latency_slo_seconds")
    @classmethod
    def _slo_is_a_bucket(cls, value: float) -> float:
        if value not in VLLM_E2E_LATENCY.buckets:
            raise ValueError(
                f"{value} is not a bucket of {VLLM_E2E_LATENCY.name}: one of "
                f"{', '.join(f'{b:g}' for b in VLLM_E2E_LATENCY.buckets)}"
            )
        return value

    @model_validator(mode="after")
    def _breaker_opens_above_half_open(self) -> Thresholds:
        if self.error_ratio_open <= self.error_ratio_half_open:
            raise ValueError(
                f"error_ratio_open ({self.error_ratio_open}) must be above "
                f"error_ratio_half_open ({self.error_ratio_half_open}): the breaker half opens "
                "first"
            )
        return self
