"""The memory watermark: one level from the worst of several utilisation signals.

Pure logic, no I/O: the stat logger feeds it once per engine step. Going up is immediate (the
engine may be seconds from OOM); going down needs the signal to fall ``hysteresis`` below the
threshold it crossed, so a signal hovering on a threshold does not flap alerts and leases.
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

    @property
    def entered(self) -> str:
        return WATERMARK_LEVELS[self.current]


class Watermark:
    def __init__(self, thresholds: tuple[float, float, float], hysteresis: float) -> None:
        self.thresholds = thresholds
        self.hysteresis = hysteresis
        self.level = NORMAL
        self.worst_source: str | None = None

    def _raw_level(self, ratio: float) -> int:
        level = NORMAL
        for index, threshold in enumerate(self.thresholds, start=1):
            if ratio >= threshold:
                level = index
        return level

    def update(self, signals: Mapping[str, float]) -> WatermarkChange | None:
        """Feed the latest ratio of each available signal; return the change, if any."""
        if signals:
            self.worst_source, worst = max(signals.items(), key=lambda item: item[1])
        else:
            self.worst_source, worst = None, 0.0
        target = self._raw_level(worst)
        if target < self.level:
            # Step down only once the signal is below the threshold minus the hysteresis.
            target = min(self.level, self._raw_level(worst + self.hysteresis))
        if target == self.level:
            return None
        change = WatermarkChange(self.level, target)
        self.level = target
        return change
