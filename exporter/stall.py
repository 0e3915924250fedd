"""Collectors on the API process's background thread, for what must change when no step comes:
the stall check (the hung engine that still answers /health) and the watermark peak's decay.
A stalled engine calls nothing, so these checks must come from outside the step path.

What "no step progress" means: the API process sees steps *end*. When none ends for a while
with requests waiting, either one step is long (a long prefill, a huge batch) or the engine is
hung. The engine processes' heartbeats (``exporter.heartbeat``) tell which:

- an engine process stopped beating (stopped, frozen): a stall once its beat is older than the
  stall timeout or the hang threshold, whichever is shorter;
- a step has run longer than the **hang threshold**: a hang inside the step (a kernel or a
  collective that never returns, with every thread still alive);
- no engine step runs at all for ``WARDEN_STALL_TIMEOUT_S`` (the engine ignores its queue).

The hang threshold is learned from this engine's own steps (``exporter.step_clock``): a
multiple (``WARDEN_STALL_HANG_MULTIPLE``, 10) of the longest step seen after the warm-up, never
below ``WARDEN_STALL_HANG_FLOOR_S`` (10 s) and never above ``WARDEN_STALL_MAX_STEP_S`` (300 s),
which is also the threshold while nothing is learned yet (the first steps after a start:
compilation, warm-up). A saturated engine ends steps all the time, and a long prefill is
bounded by the batch's token budget: neither runs ten times its longest for ten seconds. The
threshold in force is exported as ``warden_engine_hang_threshold_seconds``. Without heartbeats
(no signal board) the plain rule holds: no step for the timeout with requests waiting.

A step is measured against the threshold by the time it had a CPU: the seconds its engine
processes waited for one (``exporter.cpu_wait``: a noisy neighbour, two engines on one core)
are taken off its age. A starved step is slow, not hung, and a restart would free no CPU; the
wait is exported as ``warden_engine_cpu_wait_seconds_total`` for the operator to see.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter import catalog
from exporter.cpu_wait import StepCpuWait
from exporter.heartbeat import Beat, read_beats
from exporter.metrics import WardenMetrics
from exporter.settings import WardenSettings, env_name
from exporter.step_monitor import StepMonitor

log = logging.getLogger("warden.exporter")


@dataclass(frozen=True)
class HangLimits:
    """How the hang threshold follows the engine's steps (``WARDEN_STALL_*``)."""

    multiple: float = 10.0
    floor_s: float = 10.0
    max_step_s: float = 300.0

    @classmethod
    def from_settings(cls, settings: WardenSettings) -> HangLimits:
        return cls(
            settings.stall_hang_multiple, settings.stall_hang_floor_s, settings.stall_max_step_s
        )

    def threshold(self, beats: Sequence[Beat] | None) -> float:
        """Seconds a step may run before it is hung: learned, or the upper bound until then."""
        learned = [b for b in beats or () if b.learned_steps > 0]
        if not learned:
            return self.max_step_s
        longest = max(b.longest_s for b in learned)
        return min(self.max_step_s, max(self.floor_s, self.multiple * longest))


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
    hang_s: float,
    cpu_wait_s: float = 0.0,
) -> Verdict:
    """Stalled or not, and why (``beats`` None: no heartbeats to consult; ``hang_s``: the
    hang threshold in force; ``cpu_wait_s``: how long the running step waited for a CPU)."""
    if pending == 0:
        return Verdict(False, "no request waiting")
    quiet_s = now - last_progress
    if quiet_s <= min(timeout_s, hang_s):
        return Verdict(False, "steps are ending")
    head = f"no engine step ended for {quiet_s:.0f}s with {pending} requests waiting"
    if beats is None:
        if quiet_s <= timeout_s:
            return Verdict(False, "steps are ending")
        return Verdict(True, head)
    # A process that is gone is a crash, which vLLM and the supervisor see on their own; its
    # leftover file must not turn the next long step into a stall.
    living = [b for b in beats if b.alive]
    silent = [b for b in living if b.age_s > min(timeout_s, hang_s)]
    if silent:
        worst = max(silent, key=lambda b: b.age_s)
        return Verdict(True, f"{head}; engine process {worst.pid} silent for {worst.age_s:.0f}s")
    running = [b.step_since for b in living if b.step_since is not None]
    if not running:
        if quiet_s <= timeout_s:
            return Verdict(False, "between steps")
        return Verdict(True, f"{head}; no engine step is running")
    # The step's own age, and no more than the API process has waited for it.
    step_s = min(now - min(running), quiet_s)
    waited = f", {cpu_wait_s:.0f}s of it waiting for a CPU" if cpu_wait_s >= 1 else ""
    if step_s - cpu_wait_s > hang_s:
        limit = f"hang threshold {hang_s:.1f}s"
        return Verdict(True, f"{head}; one step has run for {step_s:.0f}s{waited} ({limit})")
    if step_s > hang_s:
        return Verdict(False, f"one step starved of CPU, running for {step_s:.0f}s{waited}", True)
    return Verdict(False, f"one long step, running for {step_s:.0f}s; engine processes alive", True)


class StallCollector:
    name = "stall"

    def __init__(
        self,
        monitor: StepMonitor,
        metrics: WardenMetrics,
        timeout_s: float,
        limits: HangLimits | None = None,
        heartbeats: Path | None = None,
        clock: Callable[[], float] = time.time,
        cpu_wait: StepCpuWait | None = None,
    ) -> None:
        self.monitor = monitor
        self.timeout_s = timeout_s
        self.limits = limits or HangLimits()
        self.heartbeats = heartbeats
        self.clock = clock
        self._gauge = metrics.get(catalog.ENGINE_STALLED)
        self._gauge.set(0)
        self._threshold = metrics.get(catalog.ENGINE_HANG_THRESHOLD)
        self._cpu_wait_total = metrics.get(catalog.ENGINE_CPU_WAIT)
        self.cpu_wait = cpu_wait or StepCpuWait()
        self.hang_s = self.limits.threshold(None)
        self._threshold.set(self.hang_s)
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
        beats = read_beats(self.heartbeats, now) if self.heartbeats is not None else None
        self.hang_s = self.limits.threshold(beats)
        self._threshold.set(self.hang_s)
        cpu_wait_s = self._step_cpu_wait(beats)
        verdict = judge(now, pending, last_progress, beats, self.timeout_s, self.hang_s, cpu_wait_s)
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
        self.monitor.stall_reason = verdict.reason
        self._gauge.set(1 if self.stalled else 0)

    def _step_cpu_wait(self, beats: Sequence[Beat] | None) -> float:
        """The running step's CPU wait, and the engine's wait added to its counter. Only the
        processes inside the step count: a worker waiting for the next step spins in vLLM's
        message queue, and on a busy machine its wait for a CPU grew while the engine core was
        hung, which delayed the hang's verdict by seconds (CI saw 6 s)."""
        living = [b for b in beats or () if b.alive]
        in_step = [b for b in living if b.step_since is not None]
        running = [b.step_since for b in in_step if b.step_since is not None]
        before = self.cpu_wait.total_s
        step_wait_s = self.cpu_wait.update(min(running, default=None), [b.pid for b in in_step])
        self._cpu_wait_total.inc(self.cpu_wait.total_s - before)
        return step_wait_s


class WatermarkPeakCollector:
    """Lets the peak level decay on schedule: a step raises it only when the level changes."""

    name = "watermark_peak"

    def __init__(self, monitor: StepMonitor, clock: Callable[[], float] = time.time) -> None:
        self.monitor = monitor
        self.clock = clock

    def collect(self) -> None:
        self.monitor.publish_peak(self.clock())
