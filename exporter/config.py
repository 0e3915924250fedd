"""Exporter settings, read from the environment because vLLM starts the processes warden runs in.

Every value is validated at start; a bad one raises ``ConfigError`` naming the variable, and
the plugin refuses to start rather than export numbers computed from nonsense.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


class ConfigError(ValueError):
    """A setting is missing, malformed or out of range; the message names it."""


@dataclass(frozen=True)
class ExporterConfig:
    """Thresholds are fractions of memory used; hysteresis is how far below a threshold a
    signal must fall before the watermark steps down (so it does not flap on the edge)."""

    watermark_high: float = 0.90
    watermark_critical: float = 0.95
    watermark_oom_imminent: float = 0.98
    watermark_hysteresis: float = 0.02
    stall_timeout_s: float = 30.0
    collector_interval_s: float = 1.0
    peak_window_s: float = 15.0
    inject_nonfinite: bool = False
    # Test-only: sleep this long in every step that has requests, so a test process on a
    # loaded machine can observe a request while it holds its KV blocks. 0 in production.
    test_step_delay_s: float = 0.0

    def __post_init__(self) -> None:
        levels = (self.watermark_high, self.watermark_critical, self.watermark_oom_imminent)
        names = ("WARDEN_WATERMARK_HIGH", "WARDEN_WATERMARK_CRITICAL", "WARDEN_WATERMARK_OOM")
        for name, value in zip(names, levels, strict=True):
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"{name}={value}: must be a fraction in (0, 1]")
        if not levels[0] < levels[1] < levels[2]:
            raise ConfigError(
                f"{names[0]} < {names[1]} < {names[2]} must hold, got {levels[0]}, "
                f"{levels[1]}, {levels[2]}"
            )
        if not 0.0 <= self.watermark_hysteresis < self.watermark_high:
            raise ConfigError(
                f"WARDEN_WATERMARK_HYSTERESIS={self.watermark_hysteresis}: must be >= 0 and "
                "below the high threshold"
            )
        if not 0.1 <= self.stall_timeout_s <= 86400:
            raise ConfigError(f"WARDEN_STALL_TIMEOUT_S={self.stall_timeout_s}: 0.1 .. 86400")
        if not 1.0 <= self.peak_window_s <= 3600:
            raise ConfigError(f"WARDEN_WATERMARK_PEAK_WINDOW_S={self.peak_window_s}: 1 .. 3600")
        if not 0.0 <= self.test_step_delay_s <= 1.0:
            raise ConfigError(f"WARDEN_TEST_STEP_DELAY_S={self.test_step_delay_s}: 0 .. 1")
        if not 0.05 <= self.collector_interval_s <= 3600:
            raise ConfigError(
                f"WARDEN_COLLECTOR_INTERVAL_S={self.collector_interval_s}: 0.05 .. 3600"
            )

    @property
    def thresholds(self) -> tuple[float, float, float]:
        return (self.watermark_high, self.watermark_critical, self.watermark_oom_imminent)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ExporterConfig:
        env = os.environ if env is None else env
        defaults = cls()

        def number(name: str, default: float) -> float:
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                return default
            try:
                return float(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r}: not a number") from None

        inject = env.get("WARDEN_TEST_INJECT_NONFINITE", "").strip().lower()
        if inject not in ("", "0", "1", "true", "false"):
            raise ConfigError(f"WARDEN_TEST_INJECT_NONFINITE={inject!r}: use 0 or 1")
        return cls(
            watermark_high=number("WARDEN_WATERMARK_HIGH", defaults.watermark_high),
            watermark_critical=number("WARDEN_WATERMARK_CRITICAL", defaults.watermark_critical),
            watermark_oom_imminent=number("WARDEN_WATERMARK_OOM", defaults.watermark_oom_imminent),
            watermark_hysteresis=number(
                "WARDEN_WATERMARK_HYSTERESIS", defaults.watermark_hysteresis
            ),
            stall_timeout_s=number("WARDEN_STALL_TIMEOUT_S", defaults.stall_timeout_s),
            collector_interval_s=number(
                "WARDEN_COLLECTOR_INTERVAL_S", defaults.collector_interval_s
            ),
            peak_window_s=number("WARDEN_WATERMARK_PEAK_WINDOW_S", defaults.peak_window_s),
            inject_nonfinite=inject in ("1", "true"),
            test_step_delay_s=number("WARDEN_TEST_STEP_DELAY_S", defaults.test_step_delay_s),
        )
