"""Collectors on the API process's background thread, for what must change when no step comes:
the stall check (the hung engine that still answers /health) and the watermark peak's decay.
A stalled engine calls nothing, so these checks must come from outside the step path.

What "no step progress" means: the API process sees steps *end*. No step ending for
``WARDEN_STALL_TIMEOUT_S`` while requests wait is a stall only if the engine is not busy with
one long step (a long prefill on a slow CPU, a huge batch). The engine processes' heartbeats
(``exporter.heartbeat``) tell which: it is a stall when an engine process stopped beating
(stopped, frozen), or when no engine step is running at all (the engine ignores its
queue), or when a single step has run longer than ``WARDEN_STALL_MAX_STEP_S`` (a deadlock
inside a step, with every thread still alive). A saturated engine ends steps all the time and
a long step beats: neither is a stall. Without heartbeats (no signal board) the plain rule
holds: no step for the timeout with requests waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter import catalog
from exporter.heartbeat import Beat, read_beats
from exporter.metrics import WardenMetrics
from exporter.settings import env_name
from exporter.step_monitor import StepMonitor

log = logging.getLogger("warden.exporter")


@dataclass(frozen=True)
class Verdict:
    stalled: bool
    reason: str
    long_step: bool = False  # not stalled only because one step is running long


def judge(
    now: float,
    pending: int,
    last_progress: float,
    beats: Sequence[Beat] | None,
    timeout_s: float,
    max_step_s: float,
) -> Verdict:
    """Stalled or not, and why (``beats`` None: no heartbeats to consult)."""
    if pending == 0:
        return Verdict(False, "no request waiting")
    quiet_s = now - last_progress
    if quiet_s <= timeout_s:
        return Verdict(False, "steps are ending")
    head = f"no engine step ended for {quiet_s:.0f}s with {pending} requests waiting"
    if beats is None:
        return Verdict(True, head)
    # A process that is gone is a crash, which vLLM and the supervisor see on their own; its
    # leftover file must not turn the next long step into a stall.
    living = [b for b in beats if b.alive]
    silent = [b for b in living if b.age_s > timeout_s]
    if silent:
        worst = max(silent, key=lambda b: b.age_s)
        return Verdict(True, f"{head}; engine process {worst.pid} silent for {worst.age_s:.0f}s")
    running = [b.step_since for b in living if b.step_since is not None]
    if not running:
        return Verdict(True, f"{head}; no engine step is running")
    step_s = now - min(running)
    if step_s > max_step_s:
        limit = f"{env_name('stall_max_step_s')}={max_step_s:g}"
        return Verdict(True, f"{head}; one step has run for {step_s:.0f}s (limit {limit})")
    return Verdict(False, f"one long step, running for {step_s:.0f}s; engine processes alive", True)


class StallCollector:
    name = "stall"

    def __init__(
        self,
        monitor: StepMonitor,
        metrics: WardenMetrics,
        timeout_s: float,
        max_step_s: float = 300.0,
        heartbeats: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.monitor = monitor
        self.timeout_s = timeout_s
        self.max_step_s = max_step_s
        self.heartbeats = heartbeats
        self.clock = clock
        self._gauge = metrics.get(catalog.ENGINE_STALLED)
        self._gauge.set(0)
        self._last_idle = clock()
        self.stalled = False
        self.verdict = Verdict(False, "no request waiting")

    def collect(self) -> None:
        now = self.clock()
        pending = self.monitor.pending_requests()
        if pending == 0:
            self._last_idle = now
        # Work arriving on an idle engine starts the clock; every ended step resets it.
        last_progress = max(self.monitor.snapshot.timestamp, self._last_idle)
        beats = None
        if self.heartbeats is not None and now - last_progress > self.timeout_s:
            beats = read_beats(self.heartbeats, now)
        verdict = judge(now, pending, last_progress, beats, self.timeout_s, self.max_step_s)
        if verdict.stalled and not self.stalled:
            log.warning("warden: engine stalled: %s", verdict.reason)
        elif self.stalled and not verdict.stalled:
            log.warning("warden: engine no longer stalled (%s)", verdict.reason)
        elif verdict.long_step and not self.verdict.long_step:
            log.warning(
                "warden: a step is running longer than %s=%g, not a stall: %s",
                env_name("stall_timeout_s"),
                self.timeout_s,
                verdict.reason,
            )
        self.stalled = verdict.stalled
        self.verdict = verdict
        self._gauge.set(1 if self.stalled else 0)


class WatermarkPeakCollector:
    """Lets the peak level decay on schedule when no step comes to update it (idle engine)."""

    name = "watermark_peak"

    def __init__(self, monitor: StepMonitor, clock: Callable[[], float] = time.time) -> None:
        self.monitor = monitor
        self.clock = clock

    def collect(self) -> None:
        self.monitor.publish_peak(self.clock())
