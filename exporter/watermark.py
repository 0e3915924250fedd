"""The memory watermark: one level from the worst of the memory risk signals.

Pure logic, no I/O: the step monitor feeds it the risks (exporter/memory_risk.py) once per
engine step. Going up is immediate: the engine may be seconds from an OOM. Going down needs the
signal to stay ``hysteresis`` below the threshold it crossed for ``hold_s`` without a break, so
a signal hovering on a threshold cannot flap alerts and leases: a level, once entered, is held
at least ``hold_s``, so one threshold produces at most two changes per ``hold_s`` (six a minute
at the default 20 s).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.catalog import WATERMARK_LEVELS

NORMAL, HIGH, CRITICAL, OOM_IMMINENT = range(len(WATERMARK_LEVELS))


@dataclass
class WatermarkChange:
    previous: int
    current: int
    source: str | None = None  # the signal that decided it
    value: float = 0.0  # its risk then

    @property
    def entered(self) -> str:
        return WATERMARK_LEVELS[self.current]


class Watermark:
    def __init__(
        self, thresholds: tuple[float, float, float], hysteresis: float, hold_s: float = 0.0
    ) -> None:
        self.thresholds = thresholds
        self.hysteresis = hysteresis
        self.hold_s = hold_s
        self.level = NORMAL
        self.worst_source: str | None = None
        self.worst_value = 0.0
        self._clear_since: float | None = None  # when the signal last fell below the level

    def _raw_level(self, ratio: float) -> int:
        level = NORMAL
        for index, threshold in enumerate(self.thresholds, start=1):
            if ratio >= threshold:
                level = index
        return level

    def update(self, signals: Mapping[str, float], now: float = 0.0) -> WatermarkChange | None:
        """Feed the latest risk of each available signal; return the change, if any."""
        if signals:
            self.worst_source, self.worst_value = max(signals.items(), key=lambda item: item[1])
        else:
            self.worst_source, self.worst_value = None, 0.0
        worst = self.worst_value
        target = self._raw_level(worst)
        if target >= self.level:
            self._clear_since = None
            if target == self.level:
                return None
        else:
            # The level the signal still justifies once the hysteresis band is added.
            allowed = min(self.level, self._raw_level(worst + self.hysteresis))
            if allowed == self.level:
                self._clear_since = None
                return None
            if self._clear_since is None:
                self._clear_since = now
            if now - self._clear_since < self.hold_s:
                return None
            self._clear_since = None
            target = allowed
        change = WatermarkChange(self.level, target, self.worst_source, worst)
        self.level = target
        return change
