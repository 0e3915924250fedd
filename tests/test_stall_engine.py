"""The stall check against one long engine step, on a real vLLM CPU engine.

Every busy step is slowed by the test switch to twice the stall timeout. The API process sees
no step end for longer than the timeout, yet the engine is working: its processes beat and
the engine core is inside a step, so it is not a stall. A worker stopped (SIGSTOP) in the
middle of such a step stops beating: that is a stall, until it continues and the request
completes. The supervised claims (hung engine restarted, saturated engine) are in
tests/test_serve_engine.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exporter import catalog
from tests.support.engine import complete, running_engine, sample, scrape
from warden.common.waiting import wait_until
from warden.supervisor.engine import EngineProcess, engine_children

pytestmark = pytest.mark.engine

STALLED = "warden: engine stalled"


LONG_STEP_TIMEOUT_S = 3
STEP_DELAY_S = 6  # every busy step sleeps this long in the worker: twice the stall timeout


@pytest.fixture(scope="module")
def slow_engine(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcess]:
    run_dir = tmp_path_factory.mktemp("slow-steps")
    env = {
        "WARDEN_STALL_TIMEOUT_S": str(LONG_STEP_TIMEOUT_S),
        "WARDEN_TEST_STEP_DELAY_S": str(STEP_DELAY_S),
    }
    with running_engine(tiny_model, env=env, run_dir=run_dir) as engine:
        yield engine


def _stalled(engine: EngineProcess) -> bool:
    return sample(scrape(engine), catalog.ENGINE_STALLED.name) == 1


def test_one_step_longer_than_the_stall_timeout_is_not_a_stall(slow_engine: EngineProcess) -> None:
    """Each step takes twice the stall timeout; the stall gauge, polled all along, never says
    stalled (the API process's own log lines do not reach the engine log, so the verdict is
    read from /metrics)."""
    verdicts: list[bool] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            verdicts.append(_stalled(slow_engine))
            time.sleep(0.3)

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    try:
        response = complete(slow_engine, str(slow_engine.spec.model), "hello", max_tokens=3)
    finally:
        done.set()
        watcher.join()
    assert response.status_code == 200
    # At least two steps, each longer than the timeout: the check had time to judge.
    assert time.monotonic() - started >= 2 * STEP_DELAY_S
    assert verdicts and not any(verdicts), verdicts


def test_a_worker_stopped_inside_a_long_step_is_a_stall_until_it_continues(
    slow_engine: EngineProcess,
) -> None:
    assert slow_engine.pid is not None
    children = engine_children(slow_engine.pid)
    workers = [pid for pid, role in children.items() if role == "Worker"]
    assert len(workers) == 1, children
    result: list[httpx.Response] = []
    request = threading.Thread(
        target=lambda: result.append(
            complete(slow_engine, str(slow_engine.spec.model), "hello", max_tokens=4)
        )
    )
    request.start()
    try:
        wait_until(lambda: _running(slow_engine) >= 1, 120, 0.2, "the request in a step")
        os.kill(workers[0], signal.SIGSTOP)
        stopped_at = time.monotonic()
        wait_until(lambda: _stalled(slow_engine), 120, 0.2, "the stall verdict")
        # Stopped, the worker cannot beat: the verdict waited for its beat to age.
        assert time.monotonic() - stopped_at >= LONG_STEP_TIMEOUT_S - 1
    finally:
        os.kill(workers[0], signal.SIGCONT)
    request.join(300)
    assert result and result[0].status_code == 200
    wait_until(lambda: not _stalled(slow_engine), 60, 0.2, "recovered after SIGCONT")


def _running(engine: EngineProcess) -> float:
    return sample(scrape(engine), catalog.VLLM_NUM_REQUESTS_RUNNING.name)
