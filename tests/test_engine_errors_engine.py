"""A real exception in a real engine core under ``warden serve`` (issues 11 item 2, 13 item 4).

The test switch ``WARDEN_TEST_ENGINE_ERROR`` makes the worker raise a CUDA driver error
("CUDA error: an illegal memory access was encountered") on the step of a request that asks for
it. vLLM carries it to the engine core, whose step fails inside ``log_error_detail``; warden
counts it there by class, the engine core dies, the API server stays up (warden serve keeps it
alive on engine death) and answers readiness 503 with ``driver_error``, and the supervisor
restarts the engine, recording what readiness said. The CPU engine spawns its engine core; the
forked (CUDA) start is proven in test_vllm_hooks_units.py. No fakes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from exporter import catalog
from exporter.supervisor_state import SupervisorState
from tests.support.engine import free_port, parse_samples, sample
from warden.common.waiting import wait_until

pytestmark = pytest.mark.engine

START_TIMEOUT_S = 600.0


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    run_dir: Path
    port: int
    model: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def state(self) -> SupervisorState:
        return SupervisorState.load(self.run_dir / "supervisor-state.json")

    def log(self) -> str:
        return (self.run_dir / "supervisor.log").read_text(errors="replace")[-4000:]

    def metrics(self) -> dict[str, float]:
        return parse_samples(httpx.get(f"{self.url}/metrics", timeout=10).text)

    def wait_serving(self, generation: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"warden serve exited:\n{self.log()}"
            state = self.state()
            if state.generation == generation and state.phase == "running":
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{self.url}/warden/ready", timeout=5).status_code == 200:
                        return
            time.sleep(0.5)
        raise AssertionError(f"generation {generation} never served:\n{self.log()}")


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    run_dir = tmp_path_factory.mktemp("engine-errors")
    port = free_port()
    argv = [
        sys.executable, "-m", "warden.cli", "serve",
        "--port", str(port),
        "--supervisor-port", "-1",
        "--run-dir", str(run_dir),
        "--engine-log-dir", str(run_dir / "logs"),
        "--backoff-base-s", "0.5",
        str(tiny_model),
        "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--block-size", "32",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "WARDEN_TEST_ENGINE_ERROR": "1"}
    with open(run_dir / "supervisor.log", "wb") as log:
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    handle = Served(process, run_dir, port, str(tiny_model))
    try:
        handle.wait_serving(1)
        yield handle
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        # Backstop: no engine of this module outlives it (the supervisor's group is its own).
        for pid in {e for e in (handle.state().engine_pid,) if e}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def test_engine_core_error_is_counted_fails_readiness_and_is_restarted(served: Served) -> None:
    samples = served.metrics()
    assert sample(samples, catalog.ENGINE_ERRORS.name, **{"class": "cuda_driver"}) == 0.0
    assert sample(samples, catalog.SOURCE_AVAILABLE.name, source="engine_errors") == 1.0

    body = {
        "model": served.model,
        "prompt": "memory cache",
        "max_tokens": 8,
        "vllm_xargs": {"warden_raise": "cuda_driver"},
    }
    failed = httpx.post(f"{served.url}/v1/completions", json=body, timeout=120)
    assert failed.status_code >= 500

    served.wait_serving(2)
    (event,) = served.state().restarts
    # What readiness said before the restart, from warden_engine_errors_total{class}: the
    # supervisor acts on the failing driver_error check at its next probe ("unhealthy"), or, if
    # it first sees the engine core gone ("crash"), records readiness's answer with it.
    assert event.reason in ("unhealthy", "crash"), event
    assert "1 CUDA driver errors in this engine" in event.detail, event.detail
    if event.reason == "crash":
        assert "EngineCore" in event.detail and "engine dead" in event.detail, event.detail

    # The new engine serves, starts its own count at 0, and carries the restart.
    ok = httpx.post(
        f"{served.url}/v1/completions",
        json={"model": served.model, "prompt": "memory cache", "max_tokens": 4},
        timeout=120,
    )
    assert ok.status_code == 200
    samples = served.metrics()
    assert sample(samples, catalog.ENGINE_ERRORS.name, **{"class": "cuda_driver"}) == 0.0
    wait_until(  # the supervisor's restart count reaches the new engine's /metrics
        lambda: sample(served.metrics(), catalog.ENGINE_RESTARTS.name, reason=event.reason) == 1,
        timeout_s=30,
        what="restart count mirrored on /metrics",
    )
