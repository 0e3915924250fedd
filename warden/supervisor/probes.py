"""What the supervisor asks a running engine, and when an answer becomes a restart.

``ProbeTimers`` remembers since when each bad condition has held for the current engine;
``evaluate`` turns one ``/warden/ready`` answer into a ``Failure`` once a condition outlasts its
grace (no answer, stalled, engine dead) or at once (a CUDA driver error poisons the context).
No answer has two graces: a refused connection means nothing serves the port (short grace), a
timeout means a server that is alive but slow, as a busy or paged-out engine is (long grace: a
real hang is caught sooner by the stall check, which reads engine steps, not HTTP answers).
``policy_wants_eager`` reads the engine's effective policy for the ``enforce_eager`` action, in
the same ``/warden/state`` answer the memory guard reads its risks from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from warden.supervisor.config import SupervisorConfig
from warden.supervisor.engine import REFUSED, EngineProcess, Probe
from warden.supervisor.policy import STALLED, UNHEALTHY


@dataclass
class Failure:
    reason: str
    detail: str
    at: float
    planned: bool = False  # the engine still works: drain it and stop it gracefully
    source: str | None = None  # the signal behind it, where one (a memory restart's risk source)


@dataclass
class ProbeTimers:
    """Since when a condition has held, per running engine (None: it does not hold)."""

    silent: float | None = None
    stalled: float | None = None
    sick: float | None = None


def failing_checks(probe: Probe, engine: EngineProcess) -> dict[str, str]:
    """Failing readiness checks by name -> detail. Without warden's readiness endpoint (an
    older engine), vLLM's own /health stands in as the one ``engine`` check."""
    checks: Any = probe.body.get("checks") if isinstance(probe.body, dict) else None
    if not isinstance(checks, dict):
        ok = engine.get("/health").status == 200
        checks = {"engine": {"ok": ok, "detail": "vLLM /health"}}
    return {
        name: str(check.get("detail", ""))
        for name, check in checks.items()
        if isinstance(check, dict) and not check.get("ok", True)
    }


def evaluate(
    engine: EngineProcess,
    timers: ProbeTimers,
    clock: Callable[[], float],
    config: SupervisorConfig,
) -> Failure | None:
    """Probe ``/warden/ready`` once; a Failure when a bad condition has outlasted its grace.

    Graces are timed from the answer, not from before the probe was sent: a busy API server
    answers late, and a time read before the probe would cut each grace short by that delay
    (a stalled engine was restarted 0.06 s before its timeout and grace had passed)."""
    probe = engine.get("/warden/ready")
    now = clock()
    if not probe.answered:
        timers.silent = timers.silent or now
        silent_for = now - timers.silent
        if probe.no_answer == REFUSED and silent_for >= config.unhealthy_grace_s:
            return Failure(
                UNHEALTHY,
                f"no answer on /warden/ready for {silent_for:.0f}s, connection refused",
                now,
            )
        if silent_for >= config.unresponsive_grace_s:
            return Failure(
                UNHEALTHY,
                f"no answer on /warden/ready for {silent_for:.0f}s, last probe {probe.no_answer}",
                now,
            )
        return None
    timers.silent = None
    failing = failing_checks(probe, engine)
    if "stalled" in failing:
        timers.stalled = timers.stalled or now
        if now - timers.stalled >= config.stall_grace_s:
            return Failure(STALLED, f"engine stalled: {failing['stalled']}", now)
    else:
        timers.stalled = None
    if "driver_error" in failing:
        return Failure(UNHEALTHY, failing["driver_error"], now)
    if "engine" in failing:
        timers.sick = timers.sick or now
        if now - timers.sick >= config.unhealthy_grace_s:
            return Failure(UNHEALTHY, failing["engine"], now)
    else:
        timers.sick = None
    return None


def last_words(engine: EngineProcess) -> str:
    """What ``/warden/ready`` says is failing, for the record of a restart ("" if nothing)."""
    failing = failing_checks(engine.get("/warden/ready"), engine)
    if not failing:
        return ""
    return "; readiness: " + "; ".join(f"{name}: {detail}" for name, detail in failing.items())


def engine_state(engine: EngineProcess) -> Any:
    """The engine's ``GET /warden/state`` answer (policy, memory risks), None without one."""
    probe = engine.get("/warden/state")
    return probe.body if probe.status == 200 and isinstance(probe.body, dict) else None


def policy_wants_eager(state_body: Any) -> bool:
    """Whether the engine's effective policy (in its state answer) holds ``enforce_eager``."""
    if not isinstance(state_body, dict):
        return False
    policy = state_body.get("policy")
    return isinstance(policy, dict) and policy.get("enforce_eager") is True
