"""Every ``WARDEN_*`` environment variable, read and validated in one place.

vLLM starts the processes warden runs in, so the environment is how warden is configured
there; the supervisor, the CLI and the engine container read the same variables. Each field
below is one variable: ``WARDEN_`` + the field name in capitals (``watermark_high`` is
``WARDEN_WATERMARK_HIGH``). An empty value counts as unset. A bad value raises
``SettingsError`` naming the variable and the value, so a process refuses to start instead of
running on a silent default. This module is at the bottom layer (the exporter imports nothing
else), so every room of warden can import it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

PREFIX = "WARDEN_"

# While set, settings are read from this mapping instead of os.environ (``load_settings(env)``).
_mapping: ContextVar[Mapping[str, str] | None] = ContextVar("warden_settings_env", default=None)


class SettingsError(ValueError):
    """A WARDEN_* variable is malformed or out of range; the message names it."""


def env_name(field: str) -> str:
    return PREFIX + field.upper()


class WardenSettings(BaseSettings):
    """The environment of warden's processes. Grouped by who reads them."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_ignore_empty=True,
        extra="ignore",
        frozen=True,
        case_sensitive=False,
    )

    # --- memory watermark (exporter, API process) -----------------------------------------
    # Levels of the memory risk (exporter/memory_risk.py): the share of the headroom the
    # engine's plan left on the device that is used up (0 within the plan, 1 device full).
    watermark_high: float = Field(0.80, gt=0, le=1, description="risk fraction: high")
    watermark_critical: float = Field(0.90, gt=0, le=1, description="risk fraction: critical")
    watermark_oom: float = Field(0.97, gt=0, le=1, description="risk fraction: oom_imminent")
    watermark_hysteresis: float = Field(0.05, ge=0, lt=1, description="step-down margin")
    watermark_hold_s: float = Field(20.0, ge=0, le=3600, description="below this long to step down")
    watermark_peak_window_s: float = Field(15.0, ge=1, le=3600, description="peak gauge window")
    memory_settle_s: float = Field(300.0, ge=0, le=86400, description="plan: settling peak window")
    # --- host memory (exporter/host_memory.py, API process) --------------------------------
    host_memory_limit_bytes: int | None = Field(
        None,
        ge=1 << 20,
        description="declared limit of the engine's host memory (default: the cgroup's limit, "
        "else the machine's memory less the reserve)",
    )
    host_memory_headroom_bytes: int | None = Field(
        None,
        ge=1 << 20,
        description="declares the limit as the engine's settled host footprint plus this",
    )
    host_memory_reserve_bytes: int = Field(
        1 << 30, ge=0, description="machine without a cgroup limit: memory kept for the rest"
    )
    host_memory_interval_s: float = Field(
        2.0, ge=0.1, le=3600, description="host memory: seconds between two measurements"
    )
    # --- exporter cadences ----------------------------------------------------------------
    stall_timeout_s: float = Field(30.0, ge=0.1, le=86400, description="no step this long")
    stall_max_step_s: float = Field(
        300.0, ge=1, le=86400, description="one step running this long is a stall (upper bound)"
    )
    # The hang threshold learned while serving (exporter/stall.py): a step running longer than
    # multiple x the longest step seen (at least the floor, at most stall_max_step_s) is hung.
    stall_hang_multiple: float = Field(
        10.0, ge=2, le=1000, description="hung: this many times the longest step seen"
    )
    stall_hang_floor_s: float = Field(
        10.0, ge=1, le=86400, description="the learned hang threshold is never below this"
    )
    stall_warmup_steps: int = Field(
        50, ge=1, le=1_000_000, description="steps after start not learned (compile, warm-up)"
    )
    collector_interval_s: float = Field(1.0, ge=0.05, le=3600, description="device collectors")
    # --- non-finite logits check (engine workers) -----------------------------------------
    # Model Runner V2 hands logits to processors only in its processing stage, which first
    # copies them to a new float32 tensor; a batch whose every request samples plainly
    # (greedy, or temperature 1 with no top-k/top-p/min-p) skips that stage unless a processor
    # asks for it. On: every step is checked, at the cost of that copy on plain batches (4 bytes
    # x rows x vocabulary per step; benchmarks/logits_copy.py). Off: plain batches go unchecked.
    logits_check_every_step: bool = Field(
        True, description="V2 runner: check plain batches too (costs an fp32 logits copy)"
    )
    # --- engine-side control (API process) ------------------------------------------------
    config: Path | None = Field(None, description="control config file (YAML)")
    webhook_token_file: Path | None = Field(None, description="bearer token file")
    webhook_token: SecretStr | None = Field(None, description="bearer token (prefer the file)")
    webhook_insecure: bool = Field(False, description="accept control calls without a token")
    ready_max_error_rate: float = Field(0.5, ge=0, le=1, description="readiness: 5xx share")
    ready_min_requests: int = Field(10, ge=1, le=1_000_000, description="readiness: sample")
    health_sample_s: float = Field(2.0, ge=0.1, le=300, description="health window sampling")
    nonfinite_flag_wait_s: float = Field(
        0.25, ge=0, le=10, description="middleware: longest wait for a pending non-finite flag"
    )
    # --- identity in a fleet: the labels Prometheus puts on this engine's series -----------
    instance: str | None = Field(
        None, description="this engine's instance label (default: the host:port it is reached at)"
    )
    namespace: str | None = Field(None, description="Kubernetes namespace of this engine")
    cluster: str | None = Field(None, description="cluster label (Prometheus external label)")
    # --- wiring between warden's own processes (set by warden, not by people) -------------
    signal_board: Path | None = Field(None, description="shared-memory signal board")
    supervisor_state: Path | None = Field(None, description="the supervisor's state file")
    # --- command-line defaults ------------------------------------------------------------
    engine_url: str = Field("http://127.0.0.1:8000", description="engine for warden CLIs")
    prometheus_url: str = Field("http://127.0.0.1:9090", description="Prometheus for CLIs")
    # --- the engine container (compose, Kubernetes) ---------------------------------------
    model: str = Field("tiny", description="model name or path; tiny = built on first start")
    vllm_args: str = Field("", description="extra vLLM flags, shell-quoted")
    host: str = Field("0.0.0.0", description="container: address vLLM binds")
    port: int = Field(8000, ge=1, le=65535, description="container: vLLM's port")
    data_dir: Path = Field(Path("/data"), description="container: model and run folder")
    supervisor_port: int = Field(
        8001, ge=1, le=65535, description="container: the supervisor's port (liveness, control)"
    )
    # --- test switches (off in production) ------------------------------------------------
    test_inject_nonfinite: bool = Field(False, description="poison marked requests' logits")
    test_failing_collector: bool = Field(False, description="add a collector that raises")
    test_step_delay_s: float = Field(0.0, ge=0, le=120, description="sleep in busy steps")
    test_engine_error: bool = Field(False, description="marked requests raise in the worker")
    test_hang_step: bool = Field(
        False, description="a step with a marked request never ends, or computes a set time"
    )
    test_memory_creep: bool = Field(
        False, description="the engine core grows its memory at the rate `warden chaos creep` sets"
    )
    test_fork_engine_processes: bool = Field(
        False, description="a CPU host's engine core and worker are forked, not spawned"
    )

    @model_validator(mode="after")
    def _thresholds_ascend(self) -> WardenSettings:
        levels = (self.watermark_high, self.watermark_critical, self.watermark_oom)
        if not levels[0] < levels[1] < levels[2]:
            names = ", ".join(env_name(f) for f in ("watermark_high", "watermark_critical"))
            raise ValueError(
                f"{names} < {env_name('watermark_oom')} must hold, got {levels[0]}, "
                f"{levels[1]}, {levels[2]}"
            )
        if self.watermark_hysteresis >= self.watermark_high:
            raise ValueError(
                f"{env_name('watermark_hysteresis')}={self.watermark_hysteresis}: must be below "
                f"{env_name('watermark_high')}"
            )
        return self

    @property
    def thresholds(self) -> tuple[float, float, float]:
        return (self.watermark_high, self.watermark_critical, self.watermark_oom)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The process environment only: no .env files or secret folders behind people's backs;
        # ``load_settings(mapping)`` passes its values as init arguments instead.
        if _mapping.get() is not None:
            return (init_settings,)
        return (init_settings, env_settings)


def _describe(error: ValidationError, env: Mapping[str, str] | None) -> str:
    problems = []
    for item in error.errors():
        field = str(item["loc"][0]) if item["loc"] else ""
        if field:
            name = env_name(field)
            raw = (env if env is not None else os.environ).get(name)
            shown = f"{name}={raw!r}" if raw is not None else name
            problems.append(f"{shown}: {item['msg']}")
        else:
            problems.append(str(item["msg"]).removeprefix("Value error, "))
    return "invalid warden settings: " + "; ".join(problems)


def load_settings(env: Mapping[str, str] | None = None) -> WardenSettings:
    """Parse the settings from ``env`` (default: this process's environment).

    Raises SettingsError naming each bad variable. Parsed fresh on each call: long-lived
    objects call it once when they are built.
    """
    try:
        if env is None:
            return WardenSettings()
        values: dict[str, Any] = {
            key[len(PREFIX) :].lower(): value
            for key, value in env.items()
            if key.upper().startswith(PREFIX) and value != ""
        }
        known = {k: v for k, v in values.items() if k in WardenSettings.model_fields}
        token = _mapping.set(env)
        try:
            return WardenSettings(**known)
        finally:
            _mapping.reset(token)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, env)) from None
