"""What the API process knows about the engine, refreshed once per engine step.

vLLM calls the stat logger with each batch of engine outputs; the monitor turns that into the
memory watermark (from the device-side memory risks on the signal board; the KV cache is not a
memory signal), the saturation measurements (queue, drain rate, service time, preemptions),
the last-step time, and a snapshot that step listeners (the local reflex) read in the same
call. Everything here is arithmetic on values already in memory: no I/O, no device access.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.saturation import SaturationMeter, SaturationState
from exporter.settings import WardenSettings
from exporter.signals import MemorySignals, SignalBoard
from exporter.vllm_compat import EngineRequests
from exporter.watermark import Watermark, WatermarkChange


@dataclass
class StepSnapshot:
    """The engine as of its last step, in warden's own terms (vLLM's structures are unstable)."""

    timestamp: float = 0.0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    preempted: int = 0
    watermark: int = 0
    signals: dict[str, float] = field(default_factory=dict)  # memory risk by source
    watermark_source: str | None = None  # the signal that sets the level, and its risk
    watermark_value: float = 0.0
    saturation: SaturationState = field(default_factory=SaturationState)


StepListener = Callable[[StepSnapshot], None]
# The running requests' ages, oldest first, their token limits and the queue's:
# vllm_compat.served_requests.
ServedRequests = Callable[[], EngineRequests]

# The step gauges (last step, queue wait, drain rate, service time) are set at most this often:
# engines step hundreds of times a second, Prometheus scrapes every few seconds, and each set
# costs the API server's output loop CPU (the service-time forecast is a quantile over recent
# requests). Between steps ``refresh_memory`` sets the last values. A quarter second: a scrape
# sees values at most that old, against scrape intervals of seconds.
PUBLISH_EVERY_S = 0.25
# A step that changes nothing the watermark, the saturation meter or the listeners read (the
# same running and waiting counts, nothing finished or preempted, no new memory sample) only
# moves the snapshot's time and KV usage, for at most this long after the last full step: the
# time-driven changes (a watermark's hold, a reflex's release delay, a saturation hold) come at
# most this late, as late as the tick between steps (warden.engine.endpoints) makes them on an
# idle engine. Steady decoding is mostly such steps: at a light load on a 2-core machine, full
# steps every 50 ms were about 2% of the API server's CPU (benchmarks/README.md, run 15).
REPEAT_STEP_S = 0.25


class StepMonitor:
    def __init__(
        self,
        config: WardenSettings,
        metrics: WardenMetrics,
        board: SignalBoard | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.board = board
        self._memory = MemorySignals(board) if board is not None else None
        self.clock = clock
        self.snapshot = StepSnapshot()
        self.watermark = Watermark(
            config.thresholds, config.watermark_hysteresis, config.watermark_hold_s
        )
        self.saturation = SaturationMeter()
        self._listeners: list[StepListener] = []
        self._listener_errors = metrics.get(catalog.COLLECTOR_ERRORS)
        self._level = metrics.get(catalog.MEMORY_WATERMARK)
        self._transitions = metrics.get(catalog.WATERMARK_TRANSITIONS)
        self._queue_wait = metrics.get(catalog.QUEUE_WAIT_PREDICTED)
        self._drain_rate = metrics.get(catalog.DRAIN_RATE)
        self._service = metrics.get(catalog.SERVICE_TIME)
        self._queue_wait.set(0)
        # What the saturation gauges were last set to: a step that changes none sets none.
        self._published: tuple[float | None, float | None, float | None] = (0.0, None, None)
        self._published_at = -1e18  # when the step gauges were last set
        self._full_step_at = -1e18  # when a step was last fully processed
        self._quiet_steps = 0  # steps recorded as quiet since the last full one
        self._last_step = metrics.get(catalog.ENGINE_LAST_STEP)
        metrics.get(catalog.SOURCE_AVAILABLE).labels("kv_cache").set(1)
        self._level.set(0)
        self._peak = metrics.get(catalog.MEMORY_WATERMARK_PEAK)
        self._peak.set(0)
        self.inflight: Callable[[], int] | None = None
        # Seconds each started request has been served, oldest first, the tokens each may
        # generate and those the queue's may (``vllm_compat.served_requests``; set where a
        # saturation limit is): with a queue, its slots free as these end (predicted_wait),
        # the same inputs admission reads, so the gauge is the number admission decides on.
        self.served_requests: ServedRequests | None = None
        # Whether the saturation state is rebuilt at every full step: True where a saturation
        # limit decides admission on it (warden.engine.endpoints). Otherwise only the gauges and
        # /warden/state read it, and it is rebuilt when the gauges are set (every
        # ``PUBLISH_EVERY_S``) and between steps (``refresh_memory``): the meter still ingests
        # every step. Summing up its recent completions was most of a full step's cost on the
        # API server's output loop (benchmarks/README.md, quick check 84).
        self.saturation_every_step = True
        self._saturation_behind = False  # steps ingested since the state was last rebuilt
        self.stall_reason = ""  # the stall check's last verdict, for readiness to say why
        self.watermark_changed_at: float | None = None
        # Recent changes as (time, level entered, deciding signal, its risk), for
        # /warden/state and for measuring reaction times.
        self.transitions: deque[tuple[float, int, str | None, float]] = deque(maxlen=64)
        self._lock = threading.Lock()

    def add_listener(self, listener: StepListener) -> None:
        self._listeners.append(listener)

    def on_step(
        self,
        running: int | None,
        waiting: int | None,
        kv_usage: float | None,
        preempted: int = 0,
        finished: Sequence[Sequence[float]] | None = None,
        prefilled: int = 0,
    ) -> StepSnapshot:
        """One engine step: counts (None = unknown, keep the last), preemptions in it, the
        requests it finished (``SaturationMeter.observe`` says what of each), and how many
        prompts it finished prefilling."""
        snap = self.snapshot
        if (
            not finished
            and not preempted
            and not prefilled
            and self.on_quiet_step(
                snap.running if running is None else running,
                snap.waiting if waiting is None else waiting,
                snap.kv_cache_usage if kv_usage is None else kv_usage,
            )
        ):
            return snap
        now = self.clock()
        self._full_step_at = now
        previous = snap
        with self._lock:
            snap = StepSnapshot(
                timestamp=now,
                running=snap.running if running is None else running,
                waiting=snap.waiting if waiting is None else waiting,
                kv_cache_usage=snap.kv_cache_usage if kv_usage is None else kv_usage,
                preempted=preempted,
            )
            change = self._update_watermark(snap, now)
            self.saturation.ingest(
                now,
                snap.running,
                snap.waiting,
                finished or [],
                preempted,
                self._quiet_steps + 1,
                snap.kv_cache_usage,
                prefilled,
            )
            publish = now - self._published_at >= PUBLISH_EVERY_S or now < self._published_at
            if self.saturation_every_step or publish:
                snap.saturation = self._saturation_state(snap.waiting)
                self._saturation_behind = False
            else:
                snap.saturation = previous.saturation
                self._saturation_behind = True
            self._quiet_steps = 0
            self.snapshot = snap
        if publish:
            self._publish_step(snap)
        self._publish_watermark(change, now)
        return self._notify(snap)

    def _saturation_state(self, waiting: int) -> SaturationState:
        """The meter's state as of its last step, with the running requests' ages and limits
        where a saturation limit reads them (``served_requests``) and a queue waits."""
        state = self.saturation.state()
        if waiting > 0 and self.served_requests is not None:
            found = self.served_requests()
            state = replace(
                state,
                served_ages=found.served_ages,
                served_limits=found.served_limits,
                queued_limits=found.queued_limits,
            )
        return state

    def on_quiet_step(self, running: int, waiting: int, kv_usage: float) -> bool:
        """A step that finished, preempted and prefilled nothing: True when it changes nothing
        but the time and the KV usage (the same counts, no memory-risk write and no sample
        grown stale since the last read, within ``REPEAT_STEP_S`` of the last full step), and
        is recorded as such; False when ``on_step`` must process it in full. The stat logger
        calls it first: vLLM calls the logger after every engine step, on its output loop,
        where code runs cold, so a repeat costs a handful of loads there."""
        now = self.clock()
        snap = self.snapshot
        memory = self._memory
        if (
            running != snap.running
            or waiting != snap.waiting
            or snap.preempted
            or not 0 <= now - self._full_step_at < REPEAT_STEP_S
            or (memory is not None and not memory.unchanged(now))
        ):
            return False
        snap.kv_cache_usage = kv_usage
        snap.timestamp = now
        self._quiet_steps += 1  # the next full step hands the count to the saturation meter
        return True

    def refresh_memory(self) -> StepSnapshot:
        """Between steps (an idle engine makes none): the watermark from the latest memory risks,
        the rest of the snapshot as the last step left it. Listeners see it as a step."""
        now = self.clock()
        with self._lock:
            snap = replace(self.snapshot)
            change = self._update_watermark(snap, now)
            if self._saturation_behind:
                snap.saturation = self._saturation_state(snap.waiting)
                self._saturation_behind = False
            self.snapshot = snap
        if snap.timestamp > 0:
            self._publish_step(snap)  # the last step's, which a recent publication may have missed
        self._publish_watermark(change, now)
        return self._notify(snap)

    def _update_watermark(self, snap: StepSnapshot, now: float) -> WatermarkChange | None:
        signals = self.memory_signals(now)
        change = self.watermark.update(signals, now)
        snap.watermark = self.watermark.level
        snap.watermark_source = self.watermark.worst_source
        snap.watermark_value = self.watermark.worst_value
        snap.signals = signals
        return change

    def _publish_watermark(self, change: WatermarkChange | None, now: float) -> None:
        """A change of level, and the peak it may raise. The peak falls back only with time,
        which the peak collector publishes between steps (exporter/stall.py)."""
        if change is None:
            return
        self.watermark_changed_at = now
        self.transitions.append((now, change.current, change.source, change.value))
        self._level.set(change.current)
        self._transitions.labels(change.entered).inc()
        self.publish_peak(now)

    def _notify(self, snap: StepSnapshot) -> StepSnapshot:
        for listener in self._listeners:
            try:
                listener(snap)
            except Exception:
                self._listener_errors.labels(getattr(listener, "name", "step_listener")).inc()
        return snap

    def memory_signals(self, now: float) -> dict[str, float]:
        """The freshest memory risk of each source, worst over the device ranks, and the host's."""
        if self._memory is None:
            return {}
        return self._memory.read(
            5 * self.config.collector_interval_s, now, 5 * self.config.host_memory_interval_s
        )

    def _publish_step(self, snap: StepSnapshot) -> None:
        self._published_at = snap.timestamp
        self._last_step.set(snap.timestamp)
        self._publish_saturation(snap.saturation)

    def _publish_saturation(self, state: SaturationState) -> None:
        """The saturation gauges, each set only when its value changed (None keeps the last)."""
        published = (state.queue_wait_s, state.drain_rate, state.forecast_service_s)
        if published == self._published:
            return
        for gauge, value, last in zip(
            (self._queue_wait, self._drain_rate, self._service),
            published,
            self._published,
            strict=True,
        ):
            if value is not None and value != last:
                gauge.set(value)
        self._published = published

    def peak_level(self, now: float) -> int:
        """Highest level held at any moment of the last peak window. Prometheus scrapes every
        few seconds; a spike the reflex absorbs faster than that must not fall between two."""
        since = now - self.config.watermark_peak_window_s
        peak = self.watermark.level
        in_force_at_start = 0
        for at, level, *_cause in list(self.transitions):  # a copy: steps append meanwhile
            if at < since:
                in_force_at_start = level
            else:
                peak = max(peak, level)
        return max(peak, in_force_at_start)

    def publish_peak(self, now: float) -> None:
        self._peak.set(self.peak_level(now))

    def pending_requests(self) -> int:
        """Requests the engine owes an answer: its last count, or the client's in-flight count."""
        pending = self.snapshot.running + self.snapshot.waiting
        if self.inflight is not None:
            pending = max(pending, self.inflight())
        return pending


_monitor: StepMonitor | None = None
_monitor_lock = threading.Lock()


def process_monitor(factory: Callable[[], StepMonitor] | None = None) -> StepMonitor | None:
    """The API process's monitor; created by the stat logger, read by endpoints and the reflex."""
    global _monitor
    with _monitor_lock:
        if _monitor is None and factory is not None:
            _monitor = factory()
        return _monitor
