"""The local reflex: the short path from the in-engine memory watermark and queue to leases.

Called by the exporter's StepMonitor once per engine step, in the API process, so it acts
within one step of a crossing, long before a scrape, a rule evaluation and a notification
could. It only takes and releases leases (source ``reflex``), each naming the signal and value
that caused it, notes each crossing so the first refusal after it can be timed, and asks for
preemptions; the admission middleware enforces the resulting policy like any other.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from exporter.catalog import WATERMARK_LEVELS
from exporter.step_monitor import StepSnapshot
from warden.control.actions.base import ActionRequest
from warden.control.cause import Cause
from warden.control.config import ReflexSettings, WatermarkLevelActions

WATERMARK_SIGNAL = "memory_watermark"


class LeaseSink(Protocol):
    def hold_reflex(self, key: str, request: ActionRequest, cause: Cause) -> None: ...
    def drop_reflex(self, key: str) -> None: ...
    def preempt_largest(self, count: int, reason: str) -> None: ...
    def note_crossing(self, kind: str, cause: Cause, at: float) -> None: ...


def watermark_cause(snap: StepSnapshot) -> Cause:
    """The memory watermark's level, and the risk signal that set it: ``critical: device risk
    0.932``."""
    level = WATERMARK_LEVELS[snap.watermark]
    if snap.watermark_source is None:
        return Cause(WATERMARK_SIGNAL, level)
    return Cause(
        WATERMARK_SIGNAL, f"{level}: {snap.watermark_source} risk {snap.watermark_value:.3f}"
    )


class Reflex:
    name = "reflex"

    def __init__(
        self, settings: ReflexSettings, sink: LeaseSink, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.sink = sink
        self.clock = clock
        self.level = 0
        self.queue_index = -1  # index into settings.queue_levels; -1 = below all
        self._held: dict[str, tuple[ActionRequest, Cause]] = {}
        self._clear_since: dict[str, float] = {}
        self._last_preempt = -1e18
        self.first_action_at: dict[str, float] = {}

    def _level_actions(self, level: int) -> WatermarkLevelActions | None:
        name = WATERMARK_LEVELS[level]
        return getattr(self.settings, name, None) if level > 0 else None

    def _quiet(self, snap: StepSnapshot) -> bool:
        """Nothing to hold, release or enter at this step (most steps): the full pass would
        change nothing, and it runs on every step in the API server's output loop."""
        if snap.watermark or self.level or self._held or self.queue_index >= 0:
            return False
        levels = self.settings.queue_levels
        return not levels or snap.waiting < levels[0].depth

    def _queue_index(self, depth: int) -> int:
        levels = self.settings.queue_levels
        index = self.queue_index
        while index + 1 < len(levels) and depth >= levels[index + 1].depth:
            index += 1
        while index >= 0 and depth < levels[index].depth * (1 - self.settings.queue_hysteresis):
            index -= 1
        return index

    def __call__(self, snap: StepSnapshot) -> None:
        if not self.settings.enabled or self._quiet(snap):
            return
        now = self.clock()
        wanted: dict[str, tuple[ActionRequest, Cause]] = {}
        entered = snap.watermark > self.level
        self.level = snap.watermark
        level_actions = self._level_actions(snap.watermark)
        if level_actions is not None:
            cause = watermark_cause(snap)
            if entered and level_actions.actions:
                self.sink.note_crossing(WATERMARK_SIGNAL, cause, now)
            for action in level_actions.actions:
                wanted[f"watermark:{action}"] = (ActionRequest(action), cause)
            cooled = now - self._last_preempt >= self.settings.preempt_cooldown_s
            if level_actions.preempt and entered and cooled:
                self._last_preempt = now
                self.sink.preempt_largest(level_actions.preempt, WATERMARK_LEVELS[snap.watermark])
        self.queue_index = self._queue_index(snap.waiting)
        if self.queue_index >= 0:
            level = self.settings.queue_levels[self.queue_index]
            params = {"max_tokens": level.max_tokens} if level.max_tokens is not None else {}
            wanted[f"queue:{level.depth}"] = (
                ActionRequest(level.action, params),
                Cause("queue_depth", snap.waiting),
            )
        for key, (request, cause) in wanted.items():
            self.sink.hold_reflex(key, request, cause)
            self.first_action_at.setdefault(key, now)
            self._held[key] = (request, cause)
            self._clear_since.pop(key, None)
        for key in list(self._held.keys() - wanted.keys()):
            # Held a little after the condition clears: relief from a preemption must not
            # reopen admission on the very next step and refill the cache.
            since = self._clear_since.setdefault(key, now)
            if now - since >= self.settings.release_delay_s:
                self.sink.drop_reflex(key)
                del self._held[key]
                del self._clear_since[key]
                self.first_action_at.pop(key, None)
            else:
                self.sink.hold_reflex(key, *self._held[key])  # still named by its cause
