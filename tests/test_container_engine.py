"""The engine container's entrypoint, run natively with compose's environment, against the faults
a deployment meets: no fakes, one supervised container for the whole module, in order.

1. generation 1 serves; every Kubernetes probe of the manifest answers as the kubelet needs;
2. a hang inside a step (test switch) is called stalled in under 15 s, restarted in-container
   (generation 2) while liveness stays green and readiness is red;
3. a step starved of CPU past the hang threshold (another process on its core) is slow, not
   hung; then a saturated engine with long prompts (``SATURATED_S``;
   ``benchmarks/stall_saturation.py`` runs the full five minutes) gets no stall verdict and no
   restart; its batch is full. The starved step comes first, at the threshold learned from short
   steps: the saturated engine's long steps raise it (77 s once on a loaded machine), and the
   starved step has to outlast it;
4. kill -9 of the engine core: restarted (generation 3) with the cause recorded;
5. SIGSTOP of the engine core with requests pending: stalled and restarted within the bound
   (generation 4);
6. SIGTERM: the container drains and exits 0.

Each time measured is printed (``-s`` shows them).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import gettempdir
from typing import Any

import httpx
import psutil
import pytest

from exporter import catalog
from exporter.heartbeat import heartbeat_dir
from exporter.request_args import BUSY_ARG, HANG_ARG
from exporter.settings import load_settings
from tests.support.container import (
    Container,
    compose_engine_environment,
    start_container,
    stop_container,
)
from tests.support.parallel import OMP_BIND_VARIABLE
from warden.common.metrics_text import parse_samples, sample
from warden.common.tinymodel import tiny_engine_args
from warden.common.waiting import wait_until
from warden.supervisor.config import SupervisorConfig

pytestmark = pytest.mark.engine

TOKEN = "container-test-token"
# compose/.env knobs: the tiny model (compose's default) with room for long prompts; the test
# switches below (the container refuses them with a real model).
MAX_NUM_SEQS = 8
VLLM_ARGS = " ".join(
    tiny_engine_args("--max-model-len", "2048", "--max-num-seqs", str(MAX_NUM_SEQS))
)
START_TIMEOUT_S = 600.0
# A hung step is called stalled within this long after its age passes the learned threshold.
HANG_DETECTED_PAST_THRESHOLD_S = 5.0
SATURATED_S = 30.0
LONG_PROMPT_TOKENS = 1200  # "the" is one token of the tiny tokenizer
# Every busy step sleeps this long (test switch): the tiny model's steps take microseconds, so
# on two cores the API process, not the engine, would be the bottleneck; slowed, the engine is,
# as on a GPU, and its batch stays full.
STEP_DELAY_S = "0.02"
SATURATED_MAX_TOKENS = 256  # long generations: requests stay in the engine, not in the API
SATURATED_CLIENTS = MAX_NUM_SEQS + 2  # a queue behind the full batch
DEFAULTS = load_settings({})
GRACE_S = SupervisorConfig().stall_grace_s
# The starved step is held back past the hang threshold by a busy process on its core.
STARVED_PAST_THRESHOLD_S = 5.0
# A real-time busy loop on one core: it runs ahead of every ordinary thread there, which the
# kernel still lets have 5% of the core (sched_rt_runtime_us); it ends itself after argv[2] s.
BURN = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
print("burning", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    pass
"""
# The share of its core the starved thread still gets (5%), doubled for margin.
STARVED_SHARE = 0.1


def starved_step_cpu_s(window_s: float) -> float:
    """CPU time a step needs to be still running after ``window_s`` on the starved core: more
    than the starved share of the window (the learned threshold is 10 s on an idle machine and
    was 77 s on a loaded one), and at least 3 s, far less than any hang threshold."""
    return max(3.0, STARVED_SHARE * window_s)


def burn_core(engine_core_affinity: set[int]) -> int:
    """The core the busy loop holds: under xdist, the one this worker's engines are bound to
    (tests/support/parallel.py), so the other worker's engines keep theirs; alone, the last
    core (vLLM's CPU worker binds to the first)."""
    bound = os.environ.get(OMP_BIND_VARIABLE, "")
    return int(bound) if bound.isdigit() else max(engine_core_affinity)


# How late a restart may come after its threshold and grace: beats and probes run once a
# second, and both may be starved by the engine on two shared cores for a few seconds.
SLACK_S = 10.0


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    data_dir = tmp_path_factory.mktemp("container")
    env = compose_engine_environment(data_dir / "compose.env", {"WARDEN_VLLM_ARGS": VLLM_ARGS})
    token_file = data_dir / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    env["WARDEN_WEBHOOK_TOKEN_FILE"] = str(token_file)  # compose mounts it from a volume
    for name in [k for k in env if k.startswith("OTEL_")]:
        del env[name]  # no Tempo here
    env["WARDEN_TEST_HANG_STEP"] = "1"
    env["WARDEN_TEST_STEP_DELAY_S"] = STEP_DELAY_S
    handle = start_container(data_dir, env)
    engine_pids: set[int] = set()
    try:
        wait_serving(handle, 1, START_TIMEOUT_S)
        yield handle
    finally:
        with contextlib.suppress(Exception):
            engine_pids.add(handle.state().engine_pid or 0)
        stop_container(handle, engine_pids - {0})


def wait_for(handle: Container, what: str, condition: Callable[[], Any], timeout: float) -> Any:
    def holds() -> Any:
        assert handle.process.poll() is None, f"container exited:\n{handle.log()[-3000:]}"
        with contextlib.suppress(httpx.HTTPError):
            return condition()
        return None

    try:
        return wait_until(holds, timeout, 0.2, what)
    except TimeoutError:
        raise AssertionError(
            f"timed out waiting for {what}; log:\n{handle.log()[-3000:]}"
        ) from None


def wait_serving(handle: Container, generation: int, timeout: float = START_TIMEOUT_S) -> None:
    def serving() -> bool:
        state = handle.state()
        if state.generation != generation or state.phase != "running":
            return False
        return httpx.get(f"{handle.url}/health", timeout=5).status_code == 200

    wait_for(handle, f"generation {generation} serving", serving, timeout)


def metrics(handle: Container) -> dict[str, float]:
    return parse_samples(httpx.get(f"{handle.url}/metrics", timeout=10).text)


def complete(handle: Container, prompt: str = "hello", max_tokens: int = 8, **body: Any) -> Any:
    payload = {"model": handle_model(handle), "prompt": prompt, "max_tokens": max_tokens, **body}
    return httpx.post(f"{handle.url}/v1/completions", json=payload, timeout=300)


def handle_model(handle: Container) -> str:
    return str(handle.data_dir / "tiny-model")


def stalled(handle: Container) -> bool:
    return sample(metrics(handle), catalog.ENGINE_STALLED.name) == 1


def stall_verdict(handle: Container) -> str:
    """'' while not stalled, else why: readiness says (the API process's own warnings do
    not reach the container log)."""
    if not stalled(handle):
        return ""
    checks = httpx.get(f"{handle.url}/warden/ready", timeout=10).json().get("checks", {})
    return str(checks.get("stalled", {}).get("detail") or "stalled")


VERDICT, RESTART = "verdict", "restart"


def wait_for_stall(handle: Container, generation: int, timeout: float = 60) -> str:
    """VERDICT once the stall gauge says stalled, or RESTART once the supervisor has already
    restarted the engine for it. The verdict is visible only for the supervisor's grace (3 s)
    before the restart; a test process starved of CPU on a loaded machine can miss that whole
    window (CI did), and the restart's record still says when and why."""

    def seen() -> str | None:
        if handle.state().generation > generation:
            return RESTART
        return VERDICT if stalled(handle) else None

    return str(wait_for(handle, "the stall verdict or the restart it caused", seen, timeout))


def learned_threshold(handle: Container) -> float | None:
    """The hang threshold once learned (below the upper bound), else None."""
    value = sample(metrics(handle), catalog.ENGINE_HANG_THRESHOLD.name)
    return value if value < DEFAULTS.stall_max_step_s else None


def warm_up(handle: Container) -> float:
    """Ordinary short requests until the engine has learned its steps; the threshold."""
    for _ in range(2):
        assert complete(handle, max_tokens=40, ignore_eos=True).status_code == 200
    threshold = wait_for(handle, "a learned hang threshold", lambda: learned_threshold(handle), 30)
    return float(threshold)


def restarts(handle: Container, reason: str) -> float:
    return metrics(handle).get(f'{catalog.ENGINE_RESTARTS.name}{{reason="{reason}"}}', 0.0)


def _last_heartbeat(pid: int) -> float:
    """When the engine process ``pid`` last beat: its heartbeat file's time, in the folder
    beside its process tree's signal board (exporter/heartbeat.py, exporter/signals.py)."""
    folders = (Path("/dev/shm"), Path(gettempdir()))
    boards = [board for folder in folders for board in folder.glob("warden-signals-*")]
    beats = [heartbeat_dir(board) / str(pid) for board in boards]
    found = [beat for beat in beats if beat.is_file()]
    assert len(found) == 1, (pid, found)
    return found[0].stat().st_mtime


def test_every_probe_answers_on_a_serving_engine(container: Container) -> None:
    assert complete(container).status_code == 200
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container.kubelet(probe), probe


def test_a_hang_inside_a_step_is_detected_in_seconds_and_restarted(container: Container) -> None:
    threshold = warm_up(container)
    # The tiny model's steps are short: on an idle machine the threshold is the floor (10 s).
    # A loaded machine's slowest step after warm-up can raise it (10x that step), and the
    # verdict is timed from the threshold learned, not from the floor.
    assert DEFAULTS.stall_hang_floor_s <= threshold < DEFAULTS.stall_max_step_s
    sent: list[float] = []

    def hang() -> None:
        sent.append(time.time())
        with contextlib.suppress(httpx.HTTPError):
            complete(container, vllm_xargs={HANG_ARG: True})

    generation = container.state().generation
    thread = threading.Thread(target=hang, daemon=True)
    thread.start()
    seen = wait_for_stall(container, generation, timeout=threshold + 60)
    detected = time.time() - sent[0]
    if seen == VERDICT:
        assert not container.kubelet("readinessProbe"), "a hung engine leaves the Service"
        assert container.kubelet("livenessProbe"), (
            "the kubelet leaves the restart to the supervisor"
        )
    wait_serving(container, generation + 1)
    restart = container.state().restarts[-1]
    assert restart.reason == "stalled" and "hang threshold" in restart.detail, restart
    if seen == RESTART:  # the verdict came the supervisor's grace before its decision
        detected = restart.failed_at - GRACE_S - sent[0]
    # The claim is timed from the hang itself: the restart's record names the hung step's age
    # when the supervisor decided, its grace after the verdict. Timed from the request's
    # sending it also holds the time a loaded machine takes to deliver the request and start
    # the step (CI once saw 18 s that way), which is not the detector's.
    step_age = re.search(r"one step has run for (\d+)s", restart.detail)
    assert step_age is not None, restart.detail
    age_at_verdict = int(step_age[1]) - GRACE_S
    print(
        f"\nmeasured: in-step hang: threshold {threshold:.1f}s, stall verdict {detected:.1f}s "
        f"after the request, the step {age_at_verdict:.0f}s old at it, restart decided "
        f"{restart.failed_at - sent[0]:.1f}s, serving again {restart.duration_s:.1f}s after that"
    )
    assert age_at_verdict < threshold + HANG_DETECTED_PAST_THRESHOLD_S, (threshold, restart.detail)
    assert container.kubelet("readinessProbe") and complete(container).status_code == 200


def test_a_step_starved_of_cpu_past_the_hang_threshold_is_slow_not_hung(
    container: Container,
) -> None:
    """The engine core's main thread, pinned to one core beside a real-time busy loop, computes
    a step that needs ``starved_step_cpu_s`` of CPU (test switch) and gets about 5% of the core:
    the step runs past the hang threshold by the clock while the engine does all the work it is
    given, as on a host where another process holds the engine's core. The kernel counts the
    wait; no stall verdict, no restart, and the wait is on
    ``warden_engine_cpu_wait_seconds_total``."""
    threshold = warm_up(container)
    generation = container.state().generation
    core = container.engine_core()
    affinity = os.sched_getaffinity(core)
    cpu = burn_core(affinity)
    waited_before = sample(metrics(container), catalog.ENGINE_CPU_WAIT.name)
    verdicts: list[str] = []  # '' or why stalled
    window_s = threshold + STARVED_PAST_THRESHOLD_S
    step_cpu_s = starved_step_cpu_s(window_s)
    burner = subprocess.Popen(
        [sys.executable, "-c", BURN, str(cpu), str(window_s + 60)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        if burner.stdout is None or burner.stdout.readline() != b"burning\n":
            pytest.skip(f"no real-time scheduling here: {burner.communicate()[1][-300:]!r}")
        os.sched_setaffinity(core, {cpu})  # the main thread only: Linux threads have their own
        with ThreadPoolExecutor(1) as pool:
            sent = time.monotonic()
            step = pool.submit(complete, container, max_tokens=1, vllm_xargs={BUSY_ARG: step_cpu_s})
            while time.monotonic() - sent < window_s:
                with contextlib.suppress(httpx.HTTPError):
                    verdicts.append(stall_verdict(container))
                time.sleep(0.5)
            starved_for = time.monotonic() - sent
            still_running = not step.done()
            burner.kill()
            os.sched_setaffinity(core, affinity)
            response = step.result()
            took = time.monotonic() - sent
            verdicts.append(stall_verdict(container))
    finally:
        burner.kill()
        burner.wait()
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(core, affinity)
    waited = sample(metrics(container), catalog.ENGINE_CPU_WAIT.name) - waited_before
    print(
        f"\nmeasured: a step of {step_cpu_s:.1f}s CPU starved for {starved_for:.1f}s "
        f"(hang threshold {threshold:.1f}s): done {took:.1f}s after it was sent, CPU wait "
        f"counted {waited:.1f}s, {len(verdicts)} stall readings"
    )
    # The step really ran past the threshold by the clock, held back by the CPU, not hung.
    assert still_running, f"the step got its CPU within {starved_for:.1f}s"
    assert response.status_code == 200
    # By the clock the step was past the threshold; the wait the kernel counted is what held its
    # age below it (the step still had its 5% of the core, so the wait is less than its age).
    assert waited >= starved_for - threshold, (waited, starved_for, threshold)
    assert verdicts and not any(verdicts), [v for v in verdicts if v]
    assert container.state().generation == generation, "a starved engine was restarted"


def test_a_saturated_engine_with_long_prompts_is_never_stalled(container: Container) -> None:
    """More closed-loop clients than the batch holds, each request a long prompt and a long
    generation, keep the engine full (prefill chunks and decodes in the same steps, a queue
    behind them) for ``SATURATED_S``: no stall verdict, readiness never says stalled, no
    restart, while the threshold learned from these very steps is in force."""
    generation = container.state().generation
    prompt = " ".join(["the"] * LONG_PROMPT_TOKENS)
    deadline = time.monotonic() + SATURATED_S
    statuses: list[int] = []
    verdicts: list[str] = []  # '' or why stalled
    in_engine: list[float] = []
    failing_seen: set[str] = set()
    thresholds: list[float] = []

    def client(index: int) -> None:
        while time.monotonic() < deadline:
            response = complete(
                container, f"{index} {prompt}", max_tokens=SATURATED_MAX_TOKENS, ignore_eos=True
            )
            statuses.append(response.status_code)

    with ThreadPoolExecutor(SATURATED_CLIENTS) as pool:
        futures = [pool.submit(client, i) for i in range(SATURATED_CLIENTS)]
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                samples = metrics(container)
                if sample(samples, catalog.ENGINE_STALLED.name) == 1:
                    verdicts.append(stall_verdict(container) or "stalled")
                else:
                    verdicts.append("")
                thresholds.append(sample(samples, catalog.ENGINE_HANG_THRESHOLD.name))
                in_engine.append(
                    sample(samples, catalog.VLLM_NUM_REQUESTS_RUNNING.name)
                    + sample(samples, catalog.VLLM_NUM_REQUESTS_WAITING.name)
                )
                ready = httpx.get(f"{container.url}/warden/ready", timeout=10)
                failing_seen.update(ready.json().get("failing", []))
            time.sleep(0.5)
        for future in futures:
            future.result()
    full = sum(1 for n in in_engine if n >= MAX_NUM_SEQS)
    stalls = [v for v in verdicts if v]
    print(
        f"\nmeasured: saturated {SATURATED_S:.0f}s: {len(statuses)} requests, "
        f"{len(verdicts)} stall readings, batch full at {full}/{len(in_engine)}, hang "
        f"threshold {min(thresholds):.1f}-{max(thresholds):.1f}s"
    )
    assert statuses and set(statuses) == {200}, statuses
    # The engine itself was saturated: its batch full at most readings.
    assert full >= len(in_engine) / 2, in_engine
    assert verdicts and not stalls, stalls
    # The learned threshold (not only the upper bound of the warm-up) was in force.
    assert min(thresholds) < DEFAULTS.stall_max_step_s, thresholds
    assert "stalled" not in failing_seen
    assert container.state().generation == generation, "a saturated engine was restarted"
    assert restarts(container, "stalled") == 1  # the hang's, before


def test_a_killed_engine_core_is_restarted_with_its_cause(container: Container) -> None:
    generation = container.state().generation
    killed_at = time.time()
    os.kill(container.engine_core(), signal.SIGKILL)
    wait_for(container, "readiness to fail", lambda: not container.kubelet("readinessProbe"), 30)
    assert container.kubelet("livenessProbe")
    wait_serving(container, generation + 1)
    restart = container.state().restarts[-1]
    assert restart.reason == "crash" and "EngineCore" in restart.detail, restart
    print(
        f"\nmeasured: kill -9: crash noticed {restart.failed_at - killed_at:.1f}s after, "
        f"serving again {restart.duration_s:.1f}s after that"
    )
    assert complete(container).status_code == 200
    assert container.kubelet("readinessProbe") and container.kubelet("livenessProbe")
    # Every restart so far (the hang's, this crash), mirrored on the new engine's /metrics:
    # the counts survive the engines they count.
    events = container.state().restarts
    crashes = sum(1 for event in events if event.reason == "crash")

    duration = catalog.ENGINE_RESTART_DURATION.name

    def mirrored() -> bool:
        count = metrics(container).get(f"{duration}_count", 0.0)
        return restarts(container, "crash") == crashes and count == len(events)

    wait_for(container, "restart numbers on the engine's /metrics", mirrored, 30)
    assert restarts(container, "stalled") == 1  # the hang's, before
    total = metrics(container)[f"{duration}_sum"]
    assert total == pytest.approx(sum(event.duration_s or 0 for event in events))


def test_a_stopped_engine_core_is_restarted_as_stalled_within_the_bound(
    container: Container,
) -> None:
    threshold = warm_up(container)
    # A stopped process stops beating: stalled once its beat is older than the threshold
    # (or the stall timeout), then the supervisor's grace.
    limit = min(threshold, DEFAULTS.stall_timeout_s)
    generation = container.state().generation
    core = container.engine_core()
    stopped_at = time.time()
    os.kill(core, signal.SIGSTOP)
    # The stall is counted from the core's last heartbeat, which precedes the stop by up to
    # a beat on an idle machine, and by more when the beating thread waits for a busy CPU.
    last_beat_at = _last_heartbeat(core)
    try:
        with ThreadPoolExecutor(2) as pool:
            pending = [pool.submit(complete, container) for _ in range(2)]
            seen = wait_for_stall(container, generation)
            detected = time.time() - stopped_at
            if seen == VERDICT:
                assert not container.kubelet("readinessProbe")
                assert container.kubelet("livenessProbe")
            wait_serving(container, generation + 1)
            for future in pending:
                with contextlib.suppress(httpx.HTTPError):
                    future.result()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(core, signal.SIGCONT)
    restart = container.state().restarts[-1]
    took = restart.failed_at - stopped_at
    if seen == RESTART:  # the verdict came the supervisor's grace before its decision
        detected = took - GRACE_S
    print(
        f"\nmeasured: SIGSTOP: threshold {threshold:.1f}s, stall verdict {detected:.1f}s, "
        f"restart decided {took:.1f}s after the stop, serving again {restart.duration_s:.1f}s "
        "after that"
    )
    assert restart.reason == "stalled", (restart, container.log()[-3000:])
    assert limit + GRACE_S - 1.0 <= took <= limit + GRACE_S + SLACK_S, took
    # Never before the limit and the grace, counted from the last sign of life.
    assert restart.failed_at - last_beat_at >= limit + GRACE_S, (last_beat_at, took)
    assert not psutil.pid_exists(core) or psutil.Process(core).status() == psutil.STATUS_ZOMBIE
    assert complete(container).status_code == 200


def test_sigterm_drains_and_exits_cleanly(container: Container) -> None:
    server = container.state().engine_pid
    assert server is not None
    tree = [server, *(p.pid for p in psutil.Process(server).children(recursive=True))]
    stopping = time.time()
    container.process.send_signal(signal.SIGTERM)
    assert container.process.wait(120) == 0
    took = time.time() - stopping
    print(f"\nmeasured: SIGTERM to exit {took:.1f}s")
    log = container.log()
    assert "draining and stopping" in log and "drained for stop" in log
    assert all(not psutil.pid_exists(p) or _zombie(p) for p in tree), tree
    assert container.state().phase == "stopped"
    assert not container.kubelet("livenessProbe")


def _zombie(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return True
