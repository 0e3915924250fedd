"""The stall check's rule, and the engine processes' heartbeats it reads, in process.

A stall is no engine step ending for the timeout while requests wait, unless one long step is
running in engine processes that still beat. The end-to-end claims (a SIGSTOPped engine is
restarted, a long step or a saturated engine never trips the check) are in
tests/test_serve_engine.py against a real engine.
"""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporter import catalog, heartbeat, step_clock
from exporter.cpu_wait import StepCpuWait, run_delay_s
from exporter.heartbeat import Beat, Heartbeat, main_thread_in_step, read_beats
from exporter.metrics import WardenMetrics
from exporter.request_args import BUSY_ARG, HANG_ARG
from exporter.settings import WardenSettings
from exporter.stall import HangLimits, StallCollector, judge
from exporter.step_clock import StepClock
from exporter.step_monitor import StepMonitor
from warden.common.waiting import wait_until

NOW = 10_000.0
TIMEOUT = 30.0
MAX_STEP = 300.0


def beat(pid: int = 11, age: float = 0.5, step_for: float | None = None, alive: bool = True):
    return Beat(pid, age, None if step_for is None else NOW - step_for, alive)


@pytest.mark.parametrize(
    ("pending", "quiet", "beats", "stalled", "says"),
    [
        (0, 500, None, False, "no request waiting"),
        (3, 10, None, False, "steps are ending"),
        (3, 31, None, True, "no engine step ended for 31s with 3 requests waiting"),
        # One long step in processes that beat: not a stall.
        (3, 120, [beat(11, step_for=120), beat(12)], False, "one long step, running for 120s"),
        # A stopped engine core or worker stops beating.
        (3, 45, [beat(11, age=44, step_for=45), beat(12)], True, "engine process 11 silent"),
        (3, 45, [beat(11, step_for=45), beat(12, age=40)], True, "engine process 12 silent"),
        # Alive, but no step running while requests wait: the engine ignores its queue.
        (3, 45, [beat(11), beat(12)], True, "no engine step is running"),
        # A step longer than the limit: a deadlock inside it, threads alive.
        (3, 400, [beat(11, step_for=400)], True, "one step has run for 400s"),
        # A leftover file of a process that is gone does not make a long step a stall.
        (3, 120, [beat(11, step_for=120), beat(99, age=900, alive=False)], False, "long step"),
        # Heartbeats expected but none found: the plain rule.
        (3, 45, [], True, "no engine step is running"),
    ],
)
def test_a_stall_is_no_step_while_requests_wait_unless_one_long_step_beats(
    pending: int, quiet: float, beats: list[Beat] | None, stalled: bool, says: str
) -> None:
    verdict = judge(NOW, pending, NOW - quiet, beats, TIMEOUT, MAX_STEP)
    assert verdict.stalled is stalled
    assert says in verdict.reason


LEARNED = 12.0  # the hang threshold of an engine whose longest step took 1.2 s


@pytest.mark.parametrize(
    ("quiet", "beats", "stalled", "says"),
    [
        # A step far beyond the learned threshold: hung, long before the stall timeout.
        (13, [beat(11, step_for=13), beat(12)], True, "one step has run for 13s (hang threshold"),
        (11, [beat(11, step_for=11), beat(12)], False, "steps are ending"),
        # The heartbeat's step started before the last step the API process saw end: the
        # API process's wait is the step's age at most.
        (11, [beat(11, step_for=40), beat(12)], False, "steps are ending"),
        # A stopped process: silent for longer than the threshold.
        (14, [beat(11, age=13, step_for=14), beat(12)], True, "engine process 11 silent"),
        # Between steps for longer than the threshold: the stall timeout still decides.
        (20, [beat(11), beat(12)], False, "between steps"),
    ],
)
def test_a_step_beyond_the_learned_threshold_is_a_hang(
    quiet: float, beats: list[Beat], stalled: bool, says: str
) -> None:
    verdict = judge(NOW, 2, NOW - quiet, beats, TIMEOUT, LEARNED)
    assert verdict.stalled is stalled
    assert says in verdict.reason


@pytest.mark.parametrize(
    ("step_for", "cpu_wait", "stalled", "says"),
    [
        # Twice the threshold by the clock, but most of it waiting for a CPU: starved, slow.
        (25, 20, False, "one step starved of CPU, running for 25s, 20s of it waiting for a CPU"),
        # The same age with a short wait: it had the CPU and made no progress: hung.
        (25, 5, True, "one step has run for 25s, 5s of it waiting for a CPU (hang threshold"),
        # No wait at all: the threshold alone decides, as before.
        (25, 0, True, "one step has run for 25s (hang threshold"),
    ],
)
def test_the_time_a_step_waited_for_a_cpu_is_not_held_against_it(
    step_for: float, cpu_wait: float, stalled: bool, says: str
) -> None:
    beats = [beat(11, step_for=step_for), beat(12)]
    verdict = judge(NOW, 2, NOW - step_for, beats, TIMEOUT, LEARNED, cpu_wait)
    assert verdict.stalled is stalled
    assert says in verdict.reason


def test_the_cpu_wait_of_a_step_is_the_largest_among_its_processes_and_restarts_per_step() -> None:
    delays = {11: 1.0, 12: 5.0}
    wait = StepCpuWait(read=lambda pid: delays.get(pid))
    assert wait.update(100.0, [11, 12, 13]) == 0.0  # first sight: nothing to compare with
    delays.update({11: 4.0, 12: 6.0})  # 3 s and 1 s more: the step was held back 3 s
    assert wait.update(100.0, [11, 12, 13]) == 3.0
    delays.update({11: 6.0, 12: 10.0})
    assert wait.update(100.0, [11, 12]) == 7.0
    delays.update({11: 7.0, 12: 10.0})
    assert wait.update(130.0, [11, 12]) == 0.0  # a new step starts at 0
    delays.update({11: 7.5})
    assert wait.update(None, [11, 12]) == 0.0  # between steps
    assert wait.total_s == 3.0 + 4.0 + 1.0 + 0.5  # the counter keeps every reading's wait


def test_the_cpu_wait_is_read_from_the_kernels_schedstat(tmp_path: Path) -> None:
    assert (run_delay_s(os.getpid()) or 0.0) >= 0.0
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "schedstat").write_text("123456789 2500000000 77\n")
    assert run_delay_s(42, tmp_path) == 2.5
    assert run_delay_s(43, tmp_path) is None  # gone, or no schedstat: nothing discounted
    (tmp_path / "42" / "schedstat").write_text("garbage\n")
    assert run_delay_s(42, tmp_path) is None


def test_collector_discounts_a_starved_step_and_counts_the_wait(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = WardenMetrics(registry)
    clock = [NOW]
    delays = {os.getpid(): 0.0}
    monitor = StepMonitor(WardenSettings(), metrics, None, clock=lambda: clock[0])
    limits = HangLimits(max_step_s=MAX_STEP)
    stall = StallCollector(
        monitor,
        metrics,
        TIMEOUT,
        limits,
        tmp_path,
        clock=lambda: clock[0],
        cpu_wait=StepCpuWait(read=lambda pid: delays.get(pid)),
    )
    monitor.on_step(running=1, waiting=2, kv_usage=0.1)
    pid_file = tmp_path / (str(os.getpid()))
    started = clock[0] + 1
    for _ in range(12):  # 12 readings 40 s apart, the step waiting 38 s of every 40
        clock[0] += 40
        delays[os.getpid()] += 38
        pid_file.write_text(f"step {started:.3f}")
        os.utime(pid_file, (clock[0] - 0.5, clock[0] - 0.5))
        stall.collect()
        assert not stall.stalled, stall.verdict
    assert "starved of CPU" in stall.verdict.reason
    assert registry.get_sample_value(catalog.ENGINE_CPU_WAIT.name) == 11 * 38
    # The CPU is back and the step still does not end: hung, once its working time is past.
    for _ in range(10):
        clock[0] += 40
        pid_file.write_text(f"step {started:.3f}")
        os.utime(pid_file, (clock[0] - 0.5, clock[0] - 0.5))
        stall.collect()
    assert stall.stalled and "hang threshold 300.0s" in stall.verdict.reason


def test_a_hung_step_is_not_discounted_by_a_worker_spinning_between_steps(tmp_path: Path) -> None:
    """The engine core is hung in a step (blocked: no wait of its own); its worker waits for
    the next step, spinning in vLLM's message queue, and on a busy machine waits for a CPU.
    That wait is not the step's: the hang is judged at its threshold, not seconds later."""
    registry = CollectorRegistry()
    metrics = WardenMetrics(registry)
    clock = [NOW]
    core, worker = os.getpid(), os.getppid()
    delays = {core: 0.0, worker: 0.0}
    monitor = StepMonitor(WardenSettings(), metrics, None, clock=lambda: clock[0])
    stall = StallCollector(
        monitor,
        metrics,
        TIMEOUT,
        HangLimits(max_step_s=MAX_STEP),
        tmp_path,
        clock=lambda: clock[0],
        cpu_wait=StepCpuWait(read=lambda pid: delays.get(pid)),
    )
    monitor.on_step(running=1, waiting=0, kv_usage=0.1)
    started = clock[0] + 1
    verdicts = []
    for _ in range(int(MAX_STEP / 40) + 3):
        clock[0] += 40
        delays[worker] += 30  # waiting for a CPU while it waits for work
        for pid, text in ((core, f"step {started:.3f}"), (worker, "idle")):
            (tmp_path / str(pid)).write_text(text)
            os.utime(tmp_path / str(pid), (clock[0] - 0.5, clock[0] - 0.5))
        stall.collect()
        verdicts.append(stall.stalled)
    assert verdicts[-1] and f"hang threshold {MAX_STEP:.1f}s" in stall.verdict.reason
    assert "waiting for a CPU" not in stall.verdict.reason
    first = verdicts.index(True)
    assert 40 * (first + 1) - 1 <= MAX_STEP + 40  # at the threshold, not 30 s of 40 later
    # Only a step's wait is counted: the worker was waiting for work, not for the step.
    assert (registry.get_sample_value(catalog.ENGINE_CPU_WAIT.name) or 0) == 0


def test_a_worker_running_its_part_of_a_step_is_in_the_step() -> None:
    """A worker process's model run and sampling are its part of the step (seen on its main
    thread's stack); vLLM's worker defines them where the heartbeat looks."""
    from vllm.v1.worker import gpu_worker, worker_base

    for name, module in heartbeat.WORKER_STEP_FRAMES:
        owner = {worker_base.__name__: worker_base.WorkerWrapperBase}.get(module, gpu_worker.Worker)
        assert module in (worker_base.__name__, gpu_worker.__name__)
        assert hasattr(owner, name), (name, module)
    seen: list[bool] = []

    def look() -> None:
        thread = threading.Thread(target=lambda: seen.append(main_thread_in_step()))
        thread.start()
        thread.join()

    namespace = {"__name__": "vllm.v1.worker.worker_base", "look": look}
    exec("def execute_model():\n    look()\n", namespace)  # noqa: S102 - vLLM's frame
    namespace["execute_model"]()
    look()
    assert seen == [True, False]


def learned(longest: float, steps: int = 100) -> Beat:
    return Beat(11, 0.5, None, True, longest, steps)


@pytest.mark.parametrize(
    ("beats", "threshold"),
    [
        (None, 300.0),  # no heartbeats: the upper bound
        ([beat(11)], 300.0),  # nothing learned yet (warm-up): the upper bound
        ([learned(0.05)], 10.0),  # short steps: the floor
        ([learned(1.2), beat(12)], 12.0),  # a multiple of the longest step
        ([learned(0.2), learned(2.5)], 25.0),  # the longest of every engine process
        ([learned(90.0)], 300.0),  # never above WARDEN_STALL_MAX_STEP_S
    ],
)
def test_the_hang_threshold_follows_the_longest_steps(
    beats: list[Beat] | None, threshold: float
) -> None:
    assert HangLimits(10.0, 10.0, 300.0).threshold(beats) == threshold


def test_the_step_clock_learns_the_longest_step_after_the_warm_up() -> None:
    clock = StepClock(warmup_steps=2)
    for started, took in ((0.0, 30.0), (40.0, 5.0), (50.0, 0.2), (51.0, 0.5), (52.0, 0.1)):
        clock.start(started)
        assert clock.started == started
        clock.end(started + took)
        assert clock.started is None and clock.ended == started + took
    # The first two (compilation, warm-up) are not learned.
    assert clock.steps == 5 and clock.learned_steps == 3 and clock.longest_s == 0.5


def test_a_beat_publishes_the_step_clock(tmp_path: Path) -> None:
    """Where the engine core's steps are timed, the beat says when the running step started
    (not when a run of back-to-back steps did) and what was learned."""
    steps = StepClock(warmup_steps=0)
    clock = [NOW]
    beat = Heartbeat(tmp_path, in_step=lambda: True, clock=lambda: clock[0], steps=lambda: steps)
    steps.start(NOW - 0.3)
    steps.end(NOW - 0.1)
    beat.beat()  # between two steps, whatever the stack looked like a moment ago
    (found,) = read_beats(tmp_path, time.time())
    assert found.step_since is None
    assert found.longest_s == pytest.approx(0.2) and found.learned_steps == 1
    clock[0] += 5
    steps.start(NOW + 4)
    beat.beat()  # inside a timed step: since its start
    assert read_beats(tmp_path, time.time())[0].step_since == pytest.approx(NOW + 4)


def test_collector_reads_heartbeats_and_reports_a_long_step_as_no_stall(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    metrics = WardenMetrics(registry)
    clock = [NOW]
    monitor = StepMonitor(WardenSettings(), metrics, None, clock=lambda: clock[0])
    limits = HangLimits(max_step_s=MAX_STEP)
    stall = StallCollector(monitor, metrics, TIMEOUT, limits, tmp_path, clock=lambda: clock[0])
    monitor.on_step(running=1, waiting=2, kv_usage=0.1)
    pid_file = tmp_path / str(os.getpid())  # this process stands for the engine core
    clock[0] += 60
    pid_file.write_text(f"step {clock[0] - 59:.3f}")
    os.utime(pid_file, (clock[0] - 0.5, clock[0] - 0.5))
    with caplog.at_level("INFO", logger="warden.exporter"):
        stall.collect()
        assert not stall.stalled and stall.verdict.long_step
        assert registry.get_sample_value(catalog.ENGINE_STALLED.name) == 0
        os.utime(pid_file, (clock[0] - 40, clock[0] - 40))  # it stopped beating 40 s ago
        stall.collect()
        assert stall.stalled
        assert registry.get_sample_value(catalog.ENGINE_STALLED.name) == 1
        monitor.on_step(running=1, waiting=1, kv_usage=0.1)
        stall.collect()
        assert not stall.stalled
    assert registry.get_sample_value(catalog.ENGINE_HANG_THRESHOLD.name) == MAX_STEP
    messages = [r.getMessage() for r in caplog.records]
    assert any("not a stall: one long step" in m for m in messages)
    assert any("longer than WARDEN_STALL_TIMEOUT_S=30" in m for m in messages)
    assert any(
        "engine stalled" in m and f"engine process {os.getpid()} silent" in m for m in messages
    )
    assert any("no longer stalled" in m for m in messages)


def test_heartbeat_says_whether_the_main_thread_is_in_a_step(tmp_path: Path) -> None:
    in_step = [False]
    clock = [NOW]
    beat = Heartbeat(tmp_path, in_step=lambda: in_step[0], clock=lambda: clock[0])
    beat.beat()
    assert (tmp_path / str(os.getpid())).read_text() == "idle"
    in_step[0] = True
    beat.beat()
    clock[0] += 5
    beat.beat()  # still the same step: the start stays
    (found,) = read_beats(tmp_path, time.time())
    assert found.pid == os.getpid() and found.alive and found.step_since == NOW
    in_step[0] = False
    beat.beat()
    assert read_beats(tmp_path, time.time())[0].step_since is None
    beat.stop()
    assert read_beats(tmp_path, time.time()) == []  # a process that exits removes its file


def test_the_step_is_seen_on_the_main_threads_stack() -> None:
    """A function named like vLLM's engine step, in vLLM's module, running on the main thread
    (this test's), is seen from another thread; outside it, nothing is."""
    seen: list[bool] = []

    def look() -> None:
        thread = threading.Thread(target=lambda: seen.append(main_thread_in_step()))
        thread.start()
        thread.join()

    namespace = {"__name__": heartbeat.STEP_MODULE, "look": look}
    exec(  # noqa: S102 - a stand-in for vLLM's frame, compiled in vLLM's module name
        "def _process_engine_step():\n    look()\n", namespace
    )
    namespace["_process_engine_step"]()
    look()
    assert seen == [True, False]


def test_vllms_engine_core_steps_in_the_function_the_heartbeat_looks_for() -> None:
    """If vLLM renames its step, this fails here instead of every long step becoming a stall."""
    from vllm.v1.engine import core

    assert core.__name__ == heartbeat.STEP_MODULE
    for name in heartbeat.STEP_FUNCTIONS:
        assert hasattr(core.EngineCoreProc, name)
    for engine_core in (core.EngineCoreProc, core.DPEngineCoreProc):  # their busy loops
        source = inspect.getsource(engine_core)
        assert any(f"self.{name}()" in source for name in heartbeat.STEP_FUNCTIONS)


BEATING = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from exporter.heartbeat import Heartbeat
    Heartbeat(Path(sys.argv[1]), interval_s=0.1).start()
    print("beating", flush=True)
    time.sleep(600)
    """
)


def test_a_stopped_process_stops_beating_and_beats_again_when_continued(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", BEATING, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "beating\n"

        def age() -> float:
            beats = [b for b in read_beats(tmp_path, time.time()) if b.pid == child.pid]
            return beats[0].age_s if beats else float("inf")

        wait_until(lambda: age() < 5, 30, 0.05, "a first beat")
        os.kill(child.pid, signal.SIGSTOP)
        # Stopped, it cannot beat: its age only grows, however busy this machine is.
        wait_until(lambda: age() > 2, 30, 0.1, "the stopped process's beat to age")
        os.kill(child.pid, signal.SIGCONT)
        wait_until(lambda: age() < 1, 30, 0.05, "a beat after SIGCONT")
    finally:
        child.kill()
        child.wait(10)


@pytest.fixture(autouse=True)
def _no_step_clock_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patching a stand-in sets this process's step clock; later tests must not see it."""
    monkeypatch.setattr(step_clock, "_clock", None)


def _stand_in_core(requests: dict[str, object]) -> tuple[types.ModuleType, list[str]]:
    """A module shaped like vLLM's engine core: EngineCoreProc with its step method."""
    calls: list[str] = []

    class EngineCoreProc:
        scheduler = types.SimpleNamespace(requests=requests)

        def _process_engine_step(self) -> bool:
            calls.append("step")
            return True

    module = types.ModuleType(step_clock.CORE_MODULE)
    module.EngineCoreProc = EngineCoreProc  # type: ignore[attr-defined]
    return module, calls


def _request(**extra_args: object) -> object:
    return types.SimpleNamespace(sampling_params=types.SimpleNamespace(extra_args=extra_args))


def test_the_engine_core_step_is_timed_and_patched_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARDEN_STALL_WARMUP_STEPS", "1")
    module, calls = _stand_in_core({"a": _request()})
    times = iter([100.0, 100.5, 200.0, 202.0])
    assert step_clock.patch(module, clock=lambda: next(times))
    assert step_clock.patch(module)  # already wrapped: nothing changes
    core = module.EngineCoreProc()
    assert core._process_engine_step() and core._process_engine_step()
    clock = step_clock.process_clock()
    assert clock is not None and calls == ["step", "step"]
    assert clock.steps == 2 and clock.learned_steps == 1 and clock.longest_s == 2.0


def test_the_hang_switch_blocks_only_a_step_with_a_marked_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WARDEN_TEST_HANG_STEP", "1")
    requests: dict[str, object] = {"a": _request(other=1)}
    module, calls = _stand_in_core(requests)
    assert step_clock.patch(module)
    core = module.EngineCoreProc()
    assert core._process_engine_step() and calls == ["step"]  # no marked request: a step
    requests["b"] = _request(**{HANG_ARG: True})
    stepping = threading.Thread(target=core._process_engine_step, daemon=True)
    stepping.start()
    stepping.join(0.5)
    clock = step_clock.process_clock()
    assert stepping.is_alive() and clock is not None and clock.started is not None
    assert calls == ["step"]  # the hung step never reached vLLM's


def test_the_busy_switch_computes_for_the_cpu_time_a_marked_request_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WARDEN_TEST_HANG_STEP", "1")
    requests: dict[str, object] = {"a": _request(**{BUSY_ARG: "junk"})}
    module, calls = _stand_in_core(requests)
    assert step_clock.patch(module)
    core = module.EngineCoreProc()
    before = time.thread_time()
    assert core._process_engine_step()  # a value that is not a number: an ordinary step
    assert time.thread_time() - before < 0.1
    requests["b"] = _request(**{BUSY_ARG: 0.3})
    before = time.thread_time()
    assert core._process_engine_step() and calls == ["step", "step"]
    assert time.thread_time() - before >= 0.3  # CPU time, not a sleep


def test_without_the_switch_a_marked_request_steps_normally(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WARDEN_TEST_HANG_STEP", raising=False)
    module, calls = _stand_in_core({"b": _request(**{HANG_ARG: True})})
    assert step_clock.patch(module)
    assert module.EngineCoreProc()._process_engine_step() and calls == ["step"]


def test_vllms_engine_core_has_the_step_the_clock_wraps() -> None:
    from vllm.v1.engine import core

    assert core.__name__ == step_clock.CORE_MODULE
    assert callable(getattr(getattr(core, step_clock.CORE_CLASS), step_clock.STEP_METHOD))
