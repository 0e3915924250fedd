"""``warden serve`` supervising a real vLLM CPU engine on the tiny model: no fakes here.

One supervised engine serves the whole module, in order (engine starts are the slow part):
generation 1 starts without --enforce-eager; the policy's enforce_eager switches it to eager
(drain, generation 2); one crash after that opens the circuit (limit 1 restart).

A crash, a stopped engine core and a saturated engine, each with its own restart, are the
container module's (tests/test_container_engine.py runs the same supervisor through the
container's entrypoint): repeated here they cost two more engine starts and prove nothing more.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from exporter import catalog
from exporter.supervisor_state import STATE_ENV_VAR, SupervisorState
from warden.common.metrics_text import parse_samples, sample
from warden.common.outcomes import COMPLETED, FAILED, REFUSED, classify
from warden.common.ports import free_port
from warden.common.tinymodel import tiny_engine_args
from warden.common.waiting import wait_until
from warden.supervisor.engine import engine_children

pytestmark = pytest.mark.engine

TOKEN = "supervisor-test-token"
# The tiny model's base arguments without --enforce-eager (the policy switches to eager) and
# with room for long requests.
ENGINE_ARGS = tiny_engine_args("--max-model-len", "2048", drop=("--enforce-eager",))
# Steps are slowed (test switch): a long request then runs for at least 15 s, so a test
# process and a supervisor starved by the engine for seconds still see it in flight.
STEP_DELAY_S = "0.01"
LONG_REQUESTS = 4
LONG_MAX_TOKENS = 1500
START_TIMEOUT_S = 600.0
# The eager switch is the one restart the circuit allows: the next crash opens it.
MAX_RESTARTS = 1


@dataclass
class Supervised:
    process: subprocess.Popen[bytes]
    run_dir: Path
    port: int
    control_port: int
    model: str
    engine_pids: set[int] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    def state(self) -> SupervisorState:
        state = SupervisorState.load(self.run_dir / "supervisor-state.json")
        if state.engine_pid:
            self.engine_pids.add(state.engine_pid)
        return state

    def log(self) -> str:
        return (self.run_dir / "supervisor.log").read_text(errors="replace")

    def wait(self, what: str, condition: Callable[[], bool], timeout: float) -> None:
        def holds() -> bool:
            assert self.process.poll() is None, f"supervisor exited:\n{self.log()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                return condition()
            return False

        try:
            wait_until(holds, timeout, 0.2, what)
        except TimeoutError:
            raise AssertionError(
                f"timed out waiting for {what}; log:\n{self.log()[-3000:]}"
            ) from None

    def wait_serving(self, generation: int, timeout: float = START_TIMEOUT_S) -> None:
        def serving() -> bool:
            state = self.state()
            if state.generation != generation or state.phase != "running":
                return False
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200

        self.wait(f"generation {generation} serving", serving, timeout)

    def engine_core(self) -> int:
        server = self.state().engine_pid
        assert server is not None
        cores = [p for p, role in engine_children(server).items() if role == "EngineCore"]
        assert len(cores) == 1, engine_children(server)
        return cores[0]

    def complete(self, prompt: str = "hello", max_tokens: int = 8, **body: Any) -> httpx.Response:
        payload = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, **body}
        return httpx.post(f"{self.url}/v1/completions", json=payload, timeout=300)

    def running_requests(self) -> float:
        """Requests in the engine's batch now (vLLM's own gauge, summed over its labels)."""
        return sample(self.metrics(), catalog.VLLM_NUM_REQUESTS_RUNNING.name)

    def metrics(self) -> dict[str, float]:
        return parse_samples(httpx.get(f"{self.url}/metrics", timeout=10).text)


def _restarts(samples: dict[str, float], reason: str) -> float:
    return samples.get(f'{catalog.ENGINE_RESTARTS.name}{{reason="{reason}"}}', 0.0)


@pytest.fixture(scope="module")
def supervised(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    run_dir = tmp_path_factory.mktemp("supervised")
    port, control_port = free_port(), free_port()
    argv = [
        sys.executable, "-m", "warden.cli", "serve",
        "--port", str(port),
        "--supervisor-port", str(control_port),
        "--run-dir", str(run_dir),
        "--engine-log-dir", str(run_dir / "logs"),
        "--max-restarts", str(MAX_RESTARTS),
        "--backoff-base-s", "0.5",
        str(tiny_model), *ENGINE_ARGS,
    ]  # fmt: skip
    env = {
        **os.environ,
        "WARDEN_WEBHOOK_TOKEN": TOKEN,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "WARDEN_TEST_STEP_DELAY_S": STEP_DELAY_S,
    }
    with open(run_dir / "supervisor.log", "wb") as log:
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    handle = Supervised(process, run_dir, port, control_port, str(tiny_model))
    try:
        handle.wait_serving(1)
        yield handle
    finally:
        handle.state()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        for pid in handle.engine_pids:  # backstop: no engine outlives the test
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for proc in _started_by(run_dir / "supervisor-state.json"):
            with contextlib.suppress(psutil.Error):
                proc.kill()


def _started_by(state_path: Path) -> list[psutil.Process]:
    """Processes of this module's engines: they carry its state file path in their env."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(STATE_ENV_VAR) == str(state_path):
                found.append(proc)
    return found


def test_live_engine_is_ready_and_reports_health(supervised: Supervised) -> None:
    assert supervised.complete().status_code == 200
    ready = httpx.get(f"{supervised.url}/warden/ready", timeout=10)
    assert ready.status_code == 200, ready.json()
    health = httpx.get(f"{supervised.url}/warden/health", timeout=10).json()
    assert health["device_memory"] == [{"device": "cpu"}]
    assert health["windows"]["60s"]["requests"]["success"] >= 1
    assert health["supervisor"]["generation"] == 1
    samples = supervised.metrics()
    assert samples[catalog.ENGINE_EAGER_MODE.name] == 0
    assert samples[catalog.SUPERVISOR_CIRCUIT_OPEN.name] == 0
    assert samples[catalog.ENGINE_READY.name] == 1


def test_enforce_eager_drains_in_flight_requests_and_restarts_eager(
    supervised: Supervised,
) -> None:
    """Long requests are in flight when the policy asks for eager mode: those admitted finish
    during the drain, new ones get 503 + Retry-After, and the next engine runs eager.

    A long request is running before the lease is posted and lasts well past the supervisor's
    policy poll, so the switch finds it in flight whatever the machine's speed. Pacing requests
    from the test process does not work here: on two cores a generating engine can starve the
    test process for seconds, so the other long requests may reach the server only after
    admission stopped (then they are refused like any new request).
    """
    switching: list[str] = []
    # (started, ended, status or error, Retry-After, finish_reason, outcome); unix times, like
    # the state; the outcome by the one rule (warden.common.outcomes)
    outcomes: list[tuple[float, float, Any, str | None, str | None, str]] = []

    def send(max_tokens: int) -> None:
        started = time.time()
        try:
            response = supervised.complete(max_tokens=max_tokens, ignore_eos=True)
        except httpx.HTTPError as exc:
            outcomes.append((started, time.time(), type(exc).__name__, None, None, FAILED))
            return
        finish = None
        if response.status_code == 200:
            finish = response.json()["choices"][0]["finish_reason"]
        retry_after = response.headers.get("retry-after")
        outcome = classify(response.status_code, response.headers, response.content)
        outcomes.append((started, time.time(), response.status_code, retry_after, finish, outcome))

    def watch_phase() -> None:
        while not switching:
            with contextlib.suppress(httpx.HTTPError):
                state = httpx.get(f"{supervised.control_url}/supervisor/state", timeout=5).json()
                if state["phase"] != "running":
                    switching.append(state["phase"])
            time.sleep(0.05)

    with ThreadPoolExecutor(12) as pool:
        for _ in range(LONG_REQUESTS):
            pool.submit(send, LONG_MAX_TOKENS)
        supervised.wait("a long request running", lambda: supervised.running_requests() >= 1, 60)
        watcher = pool.submit(watch_phase)
        lease = httpx.post(
            f"{supervised.url}/warden/degrade",
            json={"action": "enforce_eager", "params": {}, "ttl_s": 600, "key": "graph-pool"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert lease.status_code == 200, lease.text
        watcher.result(timeout=120)
        for _ in range(5):  # new requests during the switch
            pool.submit(send, 2)
            time.sleep(0.2)
        supervised.wait_serving(2)
    state = supervised.state()
    event = state.restarts[-1]
    assert state.eager and event.reason == "enforce_eager"
    switch_at = event.failed_at  # when the supervisor acted on the policy
    admitted = [o for o in outcomes if o[5] == COMPLETED]
    assert admitted and all(o[4] == "length" for o in admitted), outcomes
    assert any(end > switch_at for _, end, *_ in admitted), (switch_at, outcomes)
    refused = [o for o in outcomes if o[5] == REFUSED]
    assert refused and all(o[2] == 503 and o[3] for o in refused), outcomes
    # Nothing sent before the switch fails (requests sent after it may meet the restart).
    failed_before = [o for o in outcomes if o[5] == FAILED and o[0] < switch_at]
    assert not failed_before, outcomes
    assert "--enforce-eager" in psutil.Process(state.engine_pid).cmdline()
    assert supervised.complete().status_code == 200
    samples = supervised.metrics()
    assert samples[catalog.ENGINE_EAGER_MODE.name] == 1
    assert _restarts(samples, "enforce_eager") == 1
    # The restart's duration is known once the new engine serves; it reaches that engine's
    # /metrics with the supervisor's next state write: waited for, not read at once.
    duration = catalog.ENGINE_RESTART_DURATION.name

    def mirrored() -> bool:
        return supervised.metrics().get(f"{duration}_count", 0) == 1

    supervised.wait("the restart's duration on the engine's /metrics", mirrored, 30)
    samples = supervised.metrics()
    assert samples[f"{duration}_sum"] == pytest.approx(supervised.state().restarts[-1].duration_s)


def test_one_crash_too_many_opens_the_circuit_and_readiness_says_why(
    supervised: Supervised,
) -> None:
    os.kill(supervised.engine_core(), signal.SIGKILL)
    supervised.wait("circuit open", lambda: supervised.state().circuit_open, 60)
    ready = None

    def stand_in_answers() -> bool:
        nonlocal ready
        ready = httpx.get(f"{supervised.url}/warden/ready", timeout=5)
        return ready.status_code == 503 and "supervisor_circuit" in ready.json()["failing"]

    supervised.wait("readiness from the stand-in", stand_in_answers, 30)
    assert ready is not None
    assert f"1 restarts in the last 3600s (limit {MAX_RESTARTS})" in json.dumps(ready.json())
    samples = supervised.metrics()
    assert samples[catalog.SUPERVISOR_CIRCUIT_OPEN.name] == 1
    assert samples[catalog.ENGINE_READY.name] == 0
    status = httpx.get(f"{supervised.control_url}/supervisor/state", timeout=5).json()
    assert status["circuit_open"] and status["phase"] == "circuit_open"
    assert "RESTART CIRCUIT OPEN" in supervised.log()
    time.sleep(3)
    assert supervised.state().generation == 2, "no restart while the circuit is open"
