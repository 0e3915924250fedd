"""The supervisor's state file: the one record of restarts that outlives every engine.

The engine's metrics live and die with its processes (a fresh multiprocess folder per start),
so the supervisor keeps the restart history in a JSON file in the run dir and hands its path to
each engine in ``WARDEN_SUPERVISOR_STATE``. The supervisor writes it; inside the engine,
``exporter.supervisor_mirror`` replays it into the catalog metrics and the readiness checks read
the circuit and drain flags; the supervisor's own /metrics page renders it. This module is the
schema all of them share, at the bottom layer they can all import. Written atomically (temp
file + rename): readers see the old or the new file, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from exporter.catalog import RESTART_REASONS
from exporter.settings import env_name, load_settings

SCHEMA_VERSION = 1
# Environment variable with the state file's path, set by the supervisor for each engine.
STATE_ENV_VAR = env_name("supervisor_state")
# The file's name inside the supervisor's run directory.
STATE_FILE = "supervisor-state.json"
# Restart events kept in the file (totals are kept exactly, separately); a fresh engine
# replays the durations of these into its histogram.
MAX_EVENTS = 1000


class Phase(StrEnum):
    """What the supervisor is doing with its engine right now."""

    STARTING = "starting"  # vLLM launched, not yet answering /health
    RUNNING = "running"  # ready (or kept running with the circuit open)
    BACKOFF = "backoff"  # waiting before the next restart
    DRAINING = "draining"  # admission stopped, in-flight requests finishing
    RESTARTING = "restarting"  # the engine is down, a new one is about to start
    CIRCUIT_OPEN = "circuit_open"  # too many restarts: down until an operator resets it
    FAILED_TO_START = "failed_to_start"  # the first start failed: the supervisor exits
    STOPPED = "stopped"  # the supervisor has shut down


@dataclass
class RestartEvent:
    seq: int
    reason: str
    failed_at: float
    restarted_at: float
    detail: str = ""
    duration_s: float | None = None  # failure to ready; None until the engine is ready


@dataclass
class SupervisorState:
    phase: Phase = Phase.STARTING
    generation: int = 0
    engine_pid: int | None = None
    eager: bool = False
    eager_since: float | None = None
    eager_reason: str = ""
    circuit_open: bool = False
    circuit_reason: str = ""
    circuit_opened_at: float | None = None
    draining: bool = False
    # Memory creep (warden/supervisor/memory_guard.py): the risk at which the supervisor
    # restarts the engine, per risk source; when each source last made it restart (a creep
    # it remembers); and why it restarts earlier than usual now ("" while it does not).
    memory_restart_risk: dict[str, float] = field(default_factory=dict)
    memory_creeps: dict[str, float] = field(default_factory=dict)
    memory_remediation: str = ""
    memory_remediation_since: float | None = None
    window: list[float] = field(default_factory=list)
    restart_totals: dict[str, int] = field(default_factory=dict)
    restarts: list[RestartEvent] = field(default_factory=list)
    updated_at: float = 0.0

    # --- changes ----------------------------------------------------------------------

    def record_restart(
        self, reason: str, failed_at: float, now: float, detail: str
    ) -> RestartEvent:
        seq = (self.restarts[-1].seq if self.restarts else 0) + 1
        seq = max(seq, sum(self.restart_totals.values()) + 1)
        event = RestartEvent(seq, reason, failed_at, now, detail)
        self.restarts = [*self.restarts, event][-MAX_EVENTS:]
        self.restart_totals[reason] = self.restart_totals.get(reason, 0) + 1
        return event

    def record_ready(self, event: RestartEvent, episode_started_at: float, now: float) -> None:
        event.duration_s = round(now - episode_started_at, 3)

    def open_circuit(self, reason: str, now: float) -> None:
        self.circuit_open = True
        self.circuit_reason = reason
        self.circuit_opened_at = now

    def close_circuit(self) -> None:
        self.circuit_open = False
        self.circuit_reason = ""
        self.circuit_opened_at = None
        self.window = []

    def set_eager(self, on: bool, reason: str, now: float) -> None:
        self.eager = on
        self.eager_reason = reason if on else ""
        self.eager_since = now if on else None

    # --- what readers want ------------------------------------------------------------

    def all_restart_totals(self) -> dict[str, int]:
        """Totals for every known reason (0 where none happened), plus any newer reason."""
        totals = {reason: 0 for reason in RESTART_REASONS}
        totals.update(self.restart_totals)
        return totals

    def restart_durations(self) -> list[float]:
        """Failure-to-ready seconds of the remembered restarts that completed."""
        return [e.duration_s for e in self.restarts if e.duration_s is not None]

    def restarts_within(self, seconds: float, now: float) -> dict[str, int]:
        """Restarts per reason in the last ``seconds``."""
        counts: dict[str, int] = {}
        for event in self.restarts:
            if now - event.restarted_at <= seconds:
                counts[event.reason] = counts.get(event.reason, 0) + 1
        return counts

    # --- file -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["phase"] = str(self.phase)
        data["version"] = SCHEMA_VERSION
        data["restart_totals"] = self.all_restart_totals()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SupervisorState:
        """Parse a saved state; unknown keys (a newer writer) are ignored."""
        known = {f for f in cls.__dataclass_fields__ if f != "restarts"}
        state = cls(**{k: v for k, v in data.items() if k in known})
        try:
            state.phase = Phase(state.phase)
        except ValueError:
            state.phase = Phase.STARTING
        state.restart_totals = {str(k): int(v) for k, v in state.restart_totals.items() if v}
        state.restarts = [
            RestartEvent(**{k: v for k, v in e.items() if k in RestartEvent.__dataclass_fields__})
            for e in data.get("restarts", [])
        ]
        return state

    def save(self, path: Path) -> None:
        self.updated_at = time.time()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".supervisor-state-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(self.to_json(), handle, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @classmethod
    def read(cls, path: Path) -> SupervisorState | None:
        """The saved state, or None when the file is missing or unreadable."""
        try:
            data = json.loads(path.read_text())
            return cls.from_json(data) if isinstance(data, dict) else None
        except (OSError, ValueError, TypeError):
            return None

    @classmethod
    def load(cls, path: Path) -> SupervisorState:
        """The saved state, or a fresh one if the file is missing or unreadable."""
        return cls.read(path) or cls()


def read_state_from_env() -> SupervisorState | None:
    """The state for readers inside the engine; None when not supervised or unreadable."""
    path = load_settings().supervisor_state
    return SupervisorState.read(path) if path else None
