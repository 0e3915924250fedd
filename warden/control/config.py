"""The control loop's configuration: one YAML file, validated at start.

Every threshold, TTL and mapping lives here (see ``config/warden.example.yaml`` for the
documented file). Validation is pydantic's, so an invalid value is refused with the field's
path (``reflex.queue_levels.1.depth``) and the reason; unknown keys are refused too, since a
typo in a safety setting must not silently fall back to a default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyNetwork,
    model_validator,
)

from exporter.config_file import ConfigFileError, load_model, validate_mapping
from exporter.settings import env_name, load_settings
from warden.control.actions import REGISTRY
from warden.control.actions.base import (
    MAX_LEASE_TTL_S,
    MAX_PREEMPT,
    MAX_RETRY_AFTER_S,
    RETRY_AFTER,
)
from warden.control.actions.circuit_breaker import ADMIT_FRACTION
from warden.control.actions.shed_low_priority import PRIORITY_THRESHOLD

CONFIG_ENV = env_name("config")
# The longest Retry-After a saturation refusal tells by default (``retry_after_max_s``).
RETRY_AFTER_MAX_S = 120.0


class ControlConfigError(ConfigFileError):
    """The control config is invalid; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LeaseSettings(_Strict):
    ttl_s: float = Field(
        300.0, gt=0, le=MAX_LEASE_TTL_S, description="an alert's lease life without a renewal"
    )
    max_manual_ttl_s: float = Field(
        1800.0, gt=0, le=MAX_LEASE_TTL_S, description="longest manual override (renewable)"
    )
    max_per_source: int = Field(
        256, ge=1, le=10_000, description="live leases one source (alertmanager, manual) may hold"
    )
    preempt_cooldown_s: float = Field(
        30.0, ge=0, le=3600, description="alerts and overrides preempt at most once per this"
    )


class WebhookSettings(_Strict):
    max_body_bytes: int = Field(1 << 20, ge=1024, le=64 << 20)
    allow_insecure: bool = Field(False, description="accept notifications without a token")
    tombstone_ttl_s: float = Field(
        86400.0, gt=0, le=7 * 86400, description="memory of resolved alerts"
    )
    max_tombstones: int = Field(
        10_000, ge=100, le=1_000_000, description="resolved alerts remembered at most"
    )
    max_alerts: int = Field(
        1000, ge=1, le=10_000, description="alerts read per notification; the rest are refused"
    )
    max_clock_skew_s: float = Field(
        300.0, ge=0, le=3600, description="how far ahead of this clock an alert's times may be"
    )
    max_alert_age_s: float = Field(
        3660 * 86400.0,  # ten years: an older startsAt is a wrong clock, not an alert
        gt=0,
        le=36600 * 86400,
        description="oldest startsAt believed",
    )


class ForecastSettings(_Strict):
    """The KV forecast for the request at hand. A full cache never refuses by itself (vLLM
    queues the request until blocks free up): a prompt that can never fit is answered 400, and
    the blocks a prompt lacks lengthen its predicted queue wait (admission.saturation)."""

    enabled: bool = True
    safety_margin_blocks: int = Field(1, ge=0, le=1 << 20)


class SaturationSettings(_Strict):
    """Admission at saturation, from what queueing costs users. Off until a limit is set: only
    the operator knows the latency their users accept, and a queue is no risk to the engine."""

    latency_slo_s: float | None = Field(
        None, gt=0, le=86400, description="refuse what would finish later: queue wait + service"
    )
    max_queue_wait_s: float | None = Field(
        None, gt=0, le=86400, description="refuse what would wait longer in vLLM's queue"
    )
    max_queue_depth: int | None = Field(None, ge=1, le=10_000_000, description="waiting cap")
    hold_s: float = Field(20.0, ge=0, le=3600, description="saturated held this long after")
    retry_after: Literal["computed", "constant"] = Field(
        "computed", description="computed from drain rate and queue, or admission.retry_after_s"
    )
    retry_after_min_s: float = Field(0.5, ge=0, le=3600)
    # What the OpenAI Python SDK that vLLM installs honours (vLLM requires openai>=2.25, whose
    # bound is 120 s; 1.x's was 60 s, and beyond its bound a client backs off on its own). A
    # bound below the return a refusal is booked for tells its client a time that cannot be
    # right: at 4x for 20 s the refused requests take 60-80 s to serve, and bounded at 30 s
    # and then 60 s the bookings past the bound came back together: 0.42 and 0.45-0.63 of the
    # returns were admitted (benchmarks/README.md, issue #28, runs 54-62).
    retry_after_max_s: float = Field(RETRY_AFTER_MAX_S, gt=0, le=3600)

    @property
    def enabled(self) -> bool:
        return any(
            limit is not None
            for limit in (self.latency_slo_s, self.max_queue_wait_s, self.max_queue_depth)
        )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> SaturationSettings:
        if self.retry_after_min_s > self.retry_after_max_s:
            raise ValueError("retry_after_min_s must not exceed retry_after_max_s")
        return self


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _sha256_hex(value: str) -> str:
    value = value.strip().lower()
    if not _SHA256_HEX.fullmatch(value):
        raise ValueError("expected the 64 hex digits of a SHA-256 digest (sha256sum of the key)")
    return value


Sha256Hex = Annotated[str, AfterValidator(_sha256_hex)]


class PrioritySettings(_Strict):
    """Who may say how important a request is (docs/security.md, "Priority").

    A request's priority is read from ``header`` only when it comes from a trusted source: a
    client address in ``trusted_networks`` (the gateway that sets the header), or a bearer API
    key whose SHA-256 is in ``trusted_api_key_sha256``. Every other request, and a trusted one
    that names none, gets ``default``. With the defaults nobody is trusted, and shedding
    (``priority > shed_priority_threshold``) refuses every request nobody vouched for.
    """

    header: str = Field("X-Request-Priority", min_length=1, max_length=100)
    default: int = Field(1, ge=-(2**31), le=2**31, description="untrusted or unnamed priority")
    trusted_networks: tuple[IPvAnyNetwork, ...] = ()
    trusted_api_key_sha256: tuple[Sha256Hex, ...] = ()


class AdmissionSettings(_Strict):
    # The defaults of the actions' parameters are their modules' (one place for each number).
    retry_after_s: int = Field(RETRY_AFTER.fallback, ge=1, le=MAX_RETRY_AFTER_S)
    shed_priority_threshold: int = Field(
        PRIORITY_THRESHOLD.fallback, description="shed: refuse priority above this"
    )
    half_open_admit_fraction: float = Field(ADMIT_FRACTION.fallback, gt=0, le=1)
    max_body_bytes: int = Field(
        64 << 20, ge=64 << 10, le=1 << 30, description="larger request bodies get 413"
    )
    priority: PrioritySettings = PrioritySettings()
    forecast: ForecastSettings = ForecastSettings()
    saturation: SaturationSettings = SaturationSettings()


def _reflex_action(name: str) -> str:
    allowed = REGISTRY.reflex_names()
    if name not in allowed:
        raise ValueError(f"{name!r} is not an action the reflex can take: {', '.join(allowed)}")
    return name


# An action the local reflex may take (the registry's ``reflex`` flag).
ReflexAction = Annotated[str, AfterValidator(_reflex_action)]


class QueueLevel(_Strict):
    depth: int = Field(ge=1)
    action: ReflexAction
    max_tokens: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _required_params(self) -> QueueLevel:
        """The action's required parameters are given (a queue level can give max_tokens)."""
        given = {"max_tokens"} if self.max_tokens is not None else set()
        action = REGISTRY.by_name[self.action]
        missing = [p.name for p in action.params if p.required and p.name not in given]
        if missing:
            raise ValueError(f"{self.action} needs {', '.join(missing)}")
        return self


class WatermarkLevelActions(_Strict):
    actions: tuple[ReflexAction, ...] = ()
    preempt: int = Field(0, ge=0, le=MAX_PREEMPT, description="requests to preempt on entering")


class ReflexSettings(_Strict):
    """The in-engine short path. ``high`` (most of the memory margin beyond the plan used up)
    only warns by default: refusing traffic hours before a slow creep becomes dangerous would
    sacrifice healthy requests; ``critical`` and ``oom_imminent`` act. Queue levels (depth ->
    action) are off by default: saturation is judged by queue wait (admission.saturation)."""

    enabled: bool = True
    lease_ttl_s: float = Field(10.0, gt=0, le=3600, description="renewed every step it holds")
    high: WatermarkLevelActions = WatermarkLevelActions()
    critical: WatermarkLevelActions = WatermarkLevelActions(actions=("stop_admission",), preempt=1)
    oom_imminent: WatermarkLevelActions = WatermarkLevelActions(
        actions=("stop_admission", "reject_all"), preempt=3
    )
    queue_levels: tuple[QueueLevel, ...] = ()
    queue_hysteresis: float = Field(0.1, ge=0, lt=1, description="release below depth*(1-h)")
    preempt_cooldown_s: float = Field(2.0, ge=0)
    release_delay_s: float = Field(1.0, ge=0, le=3600, description="hold after it clears")

    @model_validator(mode="after")
    def _levels_ascend(self) -> ReflexSettings:
        depths = [level.depth for level in self.queue_levels]
        if depths != sorted(set(depths)):
            raise ValueError("queue_levels depths must be strictly increasing")
        return self


class RetrySettings(_Strict):
    max_attempts: int = Field(3, ge=1, le=10)
    backoff_base_s: float = Field(0.1, ge=0, le=60)
    backoff_max_s: float = Field(2.0, ge=0, le=600)
    priority_boost: int = Field(10, ge=0, description="subtracted from priority on a resubmit")


class ControlConfig(_Strict):
    leases: LeaseSettings = LeaseSettings()
    webhook: WebhookSettings = WebhookSettings()
    admission: AdmissionSettings = AdmissionSettings()
    reflex: ReflexSettings = ReflexSettings()
    retry: RetrySettings = RetrySettings()


def _without_exporter_sections(data: dict[str, Any]) -> dict[str, Any]:
    """The file is shared with the exporter, which reads its own ``watermark`` section."""
    return {k: v for k, v in data.items() if k not in ("watermark",)}


def parse_config(data: object, source: str = "") -> ControlConfig:
    if isinstance(data, dict):
        data = _without_exporter_sections(data)
    return validate_mapping(data, ControlConfig, "warden config", source, ControlConfigError)


def load_config(path: str | Path | None = None) -> ControlConfig:
    """The file named by ``path`` or $WARDEN_CONFIG; defaults when neither is given."""
    path = path or load_settings().config
    if not path:
        return ControlConfig()
    return load_model(
        path, ControlConfig, "warden config", ControlConfigError, _without_exporter_sections
    )
