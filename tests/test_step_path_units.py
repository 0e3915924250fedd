"""The per-step path in the API server (stat logger -> StepMonitor -> listeners) runs hundreds of
times a second in vLLM's output loop, so each stage does only the work a step changes: the
memory board is read again only after a write or when a sample it counted grows stale, the
saturation meter summarises its completions only when one finishes or is preempted (and,
without a saturation limit, only when its state is read), the step
gauges are set at most every ``PUBLISH_EVERY_S`` (and the last step's values once the engine
goes quiet), and a step that changes nothing they read moves only the snapshot's time and KV
usage (``REPEAT_STEP_S``). These tests hold each shortcut to the answer of the full computation."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.saturation import SaturationMeter, predicted_wait
from exporter.settings import WardenSettings
from exporter.signals import MemorySignals, SignalBoard
from exporter.step_monitor import PUBLISH_EVERY_S, REPEAT_STEP_S, StepMonitor, StepSnapshot


class CountingBoard(SignalBoard):
    reads = 0

    def read_max_until(
        self, max_age_s: float, now: float, host_max_age_s: float | None = None
    ) -> tuple[dict[str, float], float]:
        self.reads += 1
        return super().read_max_until(max_age_s, now, host_max_age_s)


def test_memory_signals_answer_as_a_full_read_and_read_only_after_a_write_or_expiry(
    tmp_path,
) -> None:
    board = CountingBoard(str(tmp_path / "board"), create=True)
    signals = MemorySignals(board)
    board.write(0, 0.5, 0.2, timestamp=100.0)
    board.write_host(0.3, timestamp=101.0)
    assert signals.read(5, 102.0, 10) == {"device": 0.5, "allocator": 0.2, "host": 0.3}
    reads = board.reads
    for now in (102.5, 103.0, 104.9, 105.0):  # the device sample is fresh until 105.0
        assert signals.read(5, now, 10) == board.read_max(5, now, 10)
    assert board.reads == reads + 4, "the four reference reads, and no other"
    # A write is seen at the very next read.
    board.write(1, 0.9, math.nan, timestamp=105.0)
    assert signals.read(5, 105.0, 10) == {"device": 0.9, "allocator": 0.2, "host": 0.3}
    # Rank 0's sample grows stale just past 105.0, rank 1's at 110.0, the host's at 111.0.
    assert signals.read(5, 105.01, 10) == {"device": 0.9, "host": 0.3}
    assert signals.read(5, 110.5, 10) == {"host": 0.3}
    assert signals.read(5, 111.5, 10) == {}
    # A clock that went back reads again rather than trusting what it read later.
    assert signals.read(5, 104.0, 10) == board.read_max(5, 104.0, 10) != {}


def test_the_meters_kept_summary_is_the_full_computation_at_every_step() -> None:
    rng = random.Random(7)
    kept, recomputed = SaturationMeter(keep=8), SaturationMeter(keep=8)
    now = 0.0
    for _ in range(2000):
        now += rng.choice([0.001, 0.01, 0.3])
        running, waiting = rng.randint(0, 8), rng.choice([0, 0, 0, 3, 12])
        finished = [
            (rng.randint(10, 400), 0.0, rng.uniform(0.1, 5.0))
            for _ in range(rng.choice([0, 0, 0, 0, 1, 3]))
        ]
        preempted = rng.choice([0] * 20 + [1, 2])
        recomputed._summary = None  # forces the summary to be made again from scratch
        expected = recomputed.observe(now, running, waiting, finished, preempted)
        assert kept.observe(now, running, waiting, finished, preempted) == expected


def step_gauges(registry: CollectorRegistry) -> tuple[float | None, float | None]:
    return (
        registry.get_sample_value(catalog.ENGINE_LAST_STEP.name),
        registry.get_sample_value(catalog.QUEUE_WAIT_PREDICTED.name),
    )


def test_step_gauges_are_set_at_most_every_publish_interval_and_the_last_step_when_quiet() -> None:
    registry = CollectorRegistry()
    now = [1000.0]
    monitor = StepMonitor(WardenSettings(), WardenMetrics(registry), None, clock=lambda: now[0])
    for _ in range(5):  # a measured drain rate
        now[0] += 0.25
        monitor.on_step(running=8, waiting=0, kv_usage=0.5, finished=[(96, 0.0, 2.0)])
    assert step_gauges(registry)[0] == now[0]
    published_at = now[0]
    sets = 0
    last = step_gauges(registry)
    steps = int(4 * PUBLISH_EVERY_S / 0.001)
    for waiting in range(1, steps):  # steps 1 ms apart, the queue growing
        now[0] += 0.001
        snap = monitor.on_step(running=8, waiting=waiting, kv_usage=0.9)
        if step_gauges(registry) != last:
            sets += 1
            last = step_gauges(registry)
            assert now[0] - published_at >= PUBLISH_EVERY_S - 1e-9
            published_at = now[0]
    assert 1 <= sets <= 4
    assert step_gauges(registry) != (snap.timestamp, predicted_wait(snap.saturation))
    # The engine goes quiet: the tick between steps publishes the last step's values.
    now[0] += 0.3
    monitor.refresh_memory()
    assert step_gauges(registry) == pytest.approx((snap.timestamp, predicted_wait(snap.saturation)))


class CountingMeter(SaturationMeter):
    built = 0

    def state(self):  # type: ignore[no-untyped-def]
        self.built += 1
        return super().state()


def test_without_a_saturation_limit_the_state_is_summed_up_only_when_read_and_exactly() -> None:
    rng = random.Random(11)
    now = [1000.0]
    settings, clock = WardenSettings(), (lambda: now[0])
    every = StepMonitor(settings, WardenMetrics(CollectorRegistry()), None, clock=clock)
    deferred = StepMonitor(settings, WardenMetrics(CollectorRegistry()), None, clock=clock)
    deferred.saturation = CountingMeter()
    deferred.saturation_every_step = False
    rebuilt_at, last_built = -1e18, deferred.snapshot.saturation
    for _ in range(3000):
        now[0] += rng.choice([0.001, 0.004, 0.02])
        running, waiting = rng.randint(1, 8), rng.choice([0, 0, 2, 9])
        finished = [
            (rng.randint(10, 400), 0.0, rng.uniform(0.1, 5.0), 30, 0.5)
            for _ in range(rng.choice([0, 0, 0, 1, 2]))
        ]
        expected = every.on_step(running, waiting, 0.5, 0, finished)
        built = deferred.saturation.built
        snap = deferred.on_step(running, waiting, 0.5, 0, finished)
        if deferred.saturation.built > built:  # summed up: as the every-step monitor has it
            assert now[0] - rebuilt_at >= PUBLISH_EVERY_S - 1e-9
            rebuilt_at = now[0]
            assert snap.saturation == expected.saturation
            last_built = snap.saturation
        else:  # not: the last state summed up stands until the gauges are set again
            assert snap.saturation is last_built
    assert 3000 * 0.008 / PUBLISH_EVERY_S / 2 < deferred.saturation.built < 3000 / 10
    # The engine goes quiet: the tick between steps sums up the steps since, exactly.
    now[0] += 0.3
    assert deferred.refresh_memory().saturation == every.refresh_memory().saturation
    assert deferred.snapshot.saturation.measured_at == every.snapshot.saturation.measured_at


def test_a_step_that_changes_nothing_moves_only_time_and_kv_and_any_change_is_seen_at_once(
    tmp_path,
) -> None:
    board = SignalBoard(str(tmp_path / "board"), create=True)
    now = [1000.0]
    monitor = StepMonitor(
        WardenSettings(), WardenMetrics(CollectorRegistry()), board, clock=lambda: now[0]
    )
    seen: list[StepSnapshot] = []
    monitor.add_listener(seen.append)

    def step(running: int = 8, waiting: int = 2, **kw: object) -> None:
        now[0] += 0.002
        monitor.on_step(running, waiting, kw.pop("kv", 0.5), **kw)  # type: ignore[arg-type]

    step()
    assert len(seen) == 1
    for kv in (0.51, 0.52, 0.53):  # steady decoding: the same batch, the cache filling
        step(kv=kv)
    assert len(seen) == 1, "steps that change nothing reach no listener"
    assert monitor.snapshot.timestamp == now[0] and monitor.snapshot.kv_cache_usage == 0.53
    # Each change is seen at the step it comes with.
    for change, kwargs in (
        ("waiting", {"waiting": 3}),
        ("running", {"running": 7, "waiting": 3}),
        ("finished", {"running": 7, "waiting": 3, "finished": [(50, 0.0, 1.0)]}),
        ("preempted", {"running": 7, "waiting": 3, "preempted": 1}),
        ("after a preemption", {"running": 7, "waiting": 3}),
    ):
        before = len(seen)
        step(**kwargs)  # type: ignore[arg-type]
        assert len(seen) == before + 1, change
    board.write(0, 0.97, 0.1, now[0])  # a new device sample: the watermark within the step
    step(running=7, waiting=3)
    assert len(seen) == before + 2 and seen[-1].watermark > 0
    # Time-driven changes (holds, release delays) come at most REPEAT_STEP_S late.
    full_at = now[0]
    while len(seen) == before + 2:
        step(running=7, waiting=3)
    assert now[0] - full_at <= REPEAT_STEP_S + 0.002


def test_the_stat_loggers_fast_read_of_a_quiet_step_gives_what_the_full_read_gives(
    tmp_path,
) -> None:
    """vLLM's own stats objects through the stat logger (whose quiet steps skip the full reads)
    against the same steps through ``on_step``: the same listeners called with the same
    snapshots, memory writes and expiries included."""
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

    from exporter import vllm_compat
    from exporter.stat_logger import WardenStatLogger

    rng = random.Random(11)
    now = [1000.0]
    boards = [SignalBoard(str(tmp_path / f"board{i}"), create=True) for i in range(2)]
    monitors = [
        StepMonitor(
            WardenSettings(), WardenMetrics(CollectorRegistry()), board, clock=lambda: now[0]
        )
        for board in boards
    ]
    seen: list[list[StepSnapshot]] = [[], []]
    for monitor, log in zip(monitors, seen, strict=True):
        monitor.add_listener(lambda snap, log=log: log.append(replace_snapshot(snap)))
    logger = WardenStatLogger.__new__(WardenStatLogger)
    logger.monitor = monitors[0]
    logger._errors = WardenMetrics(CollectorRegistry()).get(catalog.COLLECTOR_ERRORS).labels("x")
    full_reads = [0]
    slow_path = monitors[0].on_step

    def counted_on_step(*args: object) -> StepSnapshot:
        full_reads[0] += 1
        return slow_path(*args)  # type: ignore[arg-type]

    monitors[0].on_step = counted_on_step  # type: ignore[method-assign]
    running, waiting = 4, 0
    for _ in range(3000):
        now[0] += rng.choice((0.001, 0.004, 0.02))
        if rng.random() < 0.05:
            running = max(0, min(8, running + rng.choice((-1, 1))))
        if rng.random() < 0.03:
            waiting = max(0, waiting + rng.choice((-1, 1)))
        scheduler = SchedulerStats(
            num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=rng.random()
        )
        iteration = IterationStats()
        if rng.random() < 0.03:
            iteration.num_preempted_reqs = 1
        if rng.random() < 0.04:
            iteration.finished_requests = [
                FinishedRequestStats(
                    finish_reason=None,  # type: ignore[arg-type]
                    e2e_latency=rng.uniform(0.5, 2.0),
                    num_prompt_tokens=rng.randint(8, 64),
                    num_generation_tokens=rng.randint(8, 128),
                    max_tokens_param=None,
                    queued_time=rng.uniform(0.0, 0.3),
                    prefill_time=0.01,
                    inference_time=1.0,
                    decode_time=1.0,
                    mean_time_per_output_token=0.01,
                )
            ]
        if rng.random() < 0.04:  # a prompt prefilled: its step is not timed as a decode
            iteration.time_to_first_tokens_iter = [0.05]
        if rng.random() < 0.01:
            device, allocator = rng.random(), rng.random()
            for board in boards:
                board.write(0, device, allocator, now[0])
        logger.record(scheduler, iteration)
        monitors[1].on_step(
            *vllm_compat.scheduler_counts(scheduler),
            vllm_compat.preempted_in_iteration(iteration),
            vllm_compat.finished_requests(iteration),
            vllm_compat.prefills_in_iteration(iteration),
        )
        assert monitors[0].snapshot.timestamp == monitors[1].snapshot.timestamp
        assert monitors[0].snapshot.kv_cache_usage == monitors[1].snapshot.kv_cache_usage
    assert len(seen[0]) > 100 and seen[0] == seen[1]
    assert full_reads[0] < 1500, "most steps are quiet repeats, read the fast way"
    assert logger._errors._value.get() == 0


def replace_snapshot(snap: StepSnapshot) -> StepSnapshot:
    from dataclasses import replace

    return replace(snap, signals=dict(snap.signals))
