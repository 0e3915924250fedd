"""Draining an engine before a planned restart, through the engine's manual override API.

The engine's control loop (``POST /warden/degrade``, bearer token) takes a ``stop_admission``
lease: new requests get 503 + Retry-After while those in flight finish. The supervisor waits
until vLLM reports nothing running or waiting, up to a bound, then restarts. If the override API
is missing or refuses, the drain still waits for in-flight requests (new ones keep arriving);
the result says so.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter import catalog
from warden.common.metrics_text import sum_samples
from warden.common.tokens import bearer_header
from warden.common.waiting import wait_until
from warden.control.config import LeaseSettings
from warden.control.leases import DRAIN_LEASE_KEY
from warden.supervisor.engine import EngineProcess

LEASE_KEY = DRAIN_LEASE_KEY
# The engine refuses a manual lease longer than its configured maximum (default below).
DRAIN_LEASE_MAX_TTL_S = LeaseSettings().max_manual_ttl_s


def inflight(engine: EngineProcess) -> int | None:
    """Requests vLLM is running or queueing, from its /metrics (None if it does not answer)."""
    text = engine.metrics_text()
    if text is None:
        return None
    try:
        running = sum_samples(text, catalog.VLLM_NUM_REQUESTS_RUNNING.name) or 0.0
        waiting = sum_samples(text, catalog.VLLM_NUM_REQUESTS_WAITING.name) or 0.0
    except ValueError:  # not a metrics page: no answer either
        return None
    return int(running + waiting)


@dataclass
class DrainResult:
    admission_stopped: bool
    drained: bool
    left_inflight: int | None
    waited_s: float
    detail: str = ""


class Drainer:
    def __init__(
        self,
        token: str | None,
        timeout_s: float = 120.0,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.token = token
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.clock = clock
        self.sleep = sleep

    def _headers(self) -> dict[str, str]:
        return bearer_header(self.token) if self.token else {}

    def stop_admission(self, engine: EngineProcess) -> tuple[bool, str]:
        body = {
            "action": "stop_admission",
            "params": {},
            "ttl_s": min(self.timeout_s + 60, DRAIN_LEASE_MAX_TTL_S),
            "key": LEASE_KEY,
        }
        probe = engine.post("/warden/degrade", body, self._headers())
        if probe.status is not None and 200 <= probe.status < 300:
            return True, "stop_admission lease taken"
        return False, f"POST /warden/degrade answered {probe.status}: {probe.body!r}"[:300]

    def release(self, engine: EngineProcess) -> None:
        """Drop the drain lease (when the restart is called off and the engine stays)."""
        engine.delete(f"/warden/degrade?key={LEASE_KEY}", self._headers())

    def drain(
        self, engine: EngineProcess, cancelled: Callable[[], bool] = lambda: False
    ) -> DrainResult:
        """Stop admission, then wait for in-flight requests (until ``cancelled`` says stop)."""
        started = self.clock()
        stopped, detail = self.stop_admission(engine)
        # Two idle readings in a row: a request still being tokenized in the API process is
        # not yet counted by the scheduler.
        idle_readings = 0
        left: int | None = None

        def done() -> bool:
            nonlocal idle_readings, left
            left = inflight(engine)
            idle_readings = idle_readings + 1 if left == 0 else 0
            return idle_readings >= 2 or left is None or cancelled()

        remaining = max(0.0, self.timeout_s - (self.clock() - started))
        with contextlib.suppress(TimeoutError):  # the bound is reached: restart anyway
            wait_until(done, remaining, self.poll_s, "drain", clock=self.clock, sleep=self.sleep)
        waited = self.clock() - started
        return DrainResult(stopped, left == 0, left, round(waited, 3), detail)
