"""The supervisor's answer to memory creep: drain and restart the engine before its memory runs
out, and earlier when the same creep comes back.

Linux's OOM killer, systemd-oomd and Kubernetes eviction all act by killing, with every request
in flight. The engine reports its memory risk per source on ``GET /warden/state`` (memory beyond
its own plan as a share of the headroom left: ``device``, ``allocator`` on a GPU, ``host`` for
its processes' host memory; exporter/memory_risk.py, exporter/host_memory.py). When one reaches
``restart_risk`` the supervisor drains the engine (new requests get 503 + Retry-After, those in
flight finish) and restarts it: the restart frees what crept, and costs a start-up instead of
every request in flight.

A creep that made the supervisor restart is remembered (``remember_s``, in the state file, so it
survives the supervisor). If the same source creeps again, it is the same creep: the supervisor
restarts at ``early_restart_risk``, leaving more time to drain, and on a GPU restarts in eager
mode (CUDA graphs and their private memory pools off, the usual cure for device memory creep).
On a CPU engine eager is the only mode vLLM has, so that part does not apply and the record says
so. Why it restarts earlier is kept in the state (``memory_remediation``), shown on the memory
dashboard (``warden_memory_restart_risk``) and undone with ``DELETE /supervisor/memory``.
Pure decisions on the state and the engine's answer; the loop does the I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.catalog import MEMORY_RISK_SOURCES
from exporter.supervisor_state import SupervisorState
from warden.supervisor.policy import MEMORY
from warden.supervisor.probes import Failure

# Eager mode switched on by this guard says so, so undoing the memory remediation undoes it.
EAGER_REASON_PREFIX = "memory creep came back"


def engine_signals(state_body: Any) -> dict[str, float]:
    """The risk of each memory source from a ``GET /warden/state`` answer (finite values)."""
    signals = state_body.get("signals") if isinstance(state_body, dict) else None
    if not isinstance(signals, dict):
        return {}
    out: dict[str, float] = {}
    for source, value in signals.items():
        if isinstance(value, int | float) and math.isfinite(value):
            out[str(source)] = float(value)
    return out


def _clock_time(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


@dataclass(frozen=True)
class MemoryGuard:
    restart_risk: float = 0.9
    early_restart_risk: float = 0.6
    remember_s: float = 86400.0
    cpu_engine: bool = False
    eager_allowed: bool = True

    def remembers(self, state: SupervisorState, source: str, now: float) -> bool:
        at = state.memory_creeps.get(source)
        return at is not None and now - at < self.remember_s

    def threshold(self, state: SupervisorState, source: str, now: float) -> float:
        early = self.remembers(state, source, now)
        return min(self.early_restart_risk, self.restart_risk) if early else self.restart_risk

    def thresholds(self, state: SupervisorState, now: float) -> dict[str, float]:
        return {source: self.threshold(state, source, now) for source in MEMORY_RISK_SOURCES}

    def check(
        self, signals: Mapping[str, float], state: SupervisorState, now: float
    ) -> Failure | None:
        """A planned restart when a source's risk has reached its threshold, else None."""
        over = [
            (risk, source)
            for source, risk in signals.items()
            if risk >= self.threshold(state, source, now)
        ]
        if not over:
            return None
        risk, source = max(over)
        threshold = self.threshold(state, source, now)
        detail = f"{source} memory risk {risk:.3f} reached {threshold:.2f}"
        if self.remembers(state, source, now):
            detail += (
                f" (early: the same creep made the supervisor restart at "
                f"{_clock_time(state.memory_creeps[source])})"
            )
        detail += "; draining and restarting before the limit"
        return Failure(MEMORY, detail, now, planned=True, source=source)

    def learn(self, state: SupervisorState, failure: Failure, now: float) -> bool:
        """Remember the creep behind a memory restart and record why later ones come earlier.
        True when the next start should be eager (the creep came back, on a GPU)."""
        source = failure.source or "unknown"
        came_back = self.remembers(state, source, now)
        state.memory_creeps[source] = now
        eager = False
        if came_back:
            why = (
                f"{source} memory crept back at {_clock_time(now)} after a memory restart: "
                f"restarting at risk {self.threshold(state, source, now):.2f} instead of "
                f"{self.restart_risk:.2f}"
            )
            if self.cpu_engine:
                why += "; eager mode does not apply (a CPU engine has no CUDA graphs)"
            elif self.eager_allowed and not state.eager:
                why += "; restarting with --enforce-eager (CUDA graphs off)"
                eager = True
        else:
            why = (
                f"{source} memory crept to the limit's edge at {_clock_time(now)}: if it comes "
                f"back within {self.remember_s / 3600:g} h the supervisor restarts at risk "
                f"{self.threshold(state, source, now):.2f} instead of {self.restart_risk:.2f}"
                + ("" if self.cpu_engine else " and in eager mode")
            )
        state.memory_remediation = why
        state.memory_remediation_since = now
        state.memory_restart_risk = self.thresholds(state, now)
        return eager

    def forget(self, state: SupervisorState, now: float) -> bool:
        """Undo: forget every creep, restart at the usual risk, leave eager mode this guard set.
        True if eager mode was left."""
        state.memory_creeps = {}
        state.memory_remediation = ""
        state.memory_remediation_since = None
        state.memory_restart_risk = self.thresholds(state, now)
        if state.eager and state.eager_reason.startswith(EAGER_REASON_PREFIX):
            state.set_eager(False, "", now)
            return True
        return False

    def eager_reason(self, failure: Failure) -> str:
        return f"{EAGER_REASON_PREFIX}: {failure.detail}"
