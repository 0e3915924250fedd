"""vLLM's in-place fault tolerance, driven by the supervisor.

With ``--enable-fault-tolerance`` an engine core that hits an exception in its busy loop does
not die: it aborts its requests, reports ``unhealthy`` on ``GET /fault_tolerance/status`` and
waits (``engine_recovery_timeout_sec``) for an instruction. The supervisor is that orchestrator:
it sends ``{"instruction": "retry"}`` to ``POST /fault_tolerance/apply`` and polls the status
until every engine is healthy again. An engine reported ``dead`` cannot be retried; the
supervisor restarts the process instead. vLLM 0.32 only accepts fault tolerance with external
data-parallel load balancing (an MoE model) and an EP all2all backend, so this path cannot run
on a CPU engine; see docs/supervisor.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from warden.common.waiting import wait_until
from warden.supervisor.engine import EngineProcess

FT_FLAG = "--enable-fault-tolerance"
HEALTHY, UNHEALTHY, DEAD = "healthy", "unhealthy", "dead"


def fault_tolerance_enabled(vllm_args: list[str]) -> bool:
    return FT_FLAG in vllm_args


def engine_status(engine: EngineProcess) -> str | None:
    """The worst status over the server's engines: dead > unhealthy > healthy (None: no
    answer or no fault tolerance endpoint)."""
    probe = engine.get("/fault_tolerance/status")
    if probe.status != 200 or not isinstance(probe.body, dict):
        return None
    statuses = {str(e.get("status", "")).lower() for e in probe.body.get("engines") or []}
    for status in (DEAD, UNHEALTHY):
        if status in statuses:
            return status
    return HEALTHY


def retry(
    engine: EngineProcess,
    timeout_s: float,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, str]:
    """Ask vLLM to recover in place; True once every engine reports healthy again."""
    probe = engine.post("/fault_tolerance/apply", {"instruction": "retry"})
    if probe.status != 202:
        return False, f"POST /fault_tolerance/apply answered {probe.status}: {probe.body!r}"[:300]
    status: str | None = None

    def settled() -> str | None:
        nonlocal status
        status = engine_status(engine)
        return status if status in (HEALTHY, DEAD) else None

    try:
        final = wait_until(settled, timeout_s, poll_s, "recovery", clock=clock, sleep=sleep)
    except TimeoutError:
        return False, f"no recovery within {timeout_s:.0f}s (last status {status})"
    if final == HEALTHY:
        return True, "recovered in place"
    return False, "engine reported dead during recovery"
