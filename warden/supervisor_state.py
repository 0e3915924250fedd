"""The supervisor's state file: the one record of restarts that outlives every engine.

The engine's metrics live and die with its processes (a fresh multiprocess folder per start),
so the supervisor keeps the restart history in a JSON file in the run dir and hands its path to
each engine in ``WARDEN_SUPERVISOR_STATE``. Inside the engine, ``exporter.supervisor_mirror``
replays it into the catalog metrics and ``warden.health`` reads the circuit and drain flags for
readiness. Written atomically (temp file + rename): readers see the old or the new file, never
half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from exporter.supervisor_mirror import STATE_ENV_VAR
from warden.supervisor_policy import RESTART_REASONS

SCHEMA_VERSION = 1
# Restart events kept in the file (totals are kept exactly, separately); a fresh engine
# replays the durations of these into its histogram.
MAX_EVENTS = 1000

__all__ = ["STATE_ENV_VAR", "RestartEvent", "SupervisorState"]


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
    phase: str = "starting"
    generation: int = 0
    engine_pid: int | None = None
    eager: bool = False
    eager_since: float | None = None
    eager_reason: str = ""
    circuit_open: bool = False
    circuit_reason: str = ""
    circuit_opened_at: float | None = None
    draining: bool = False
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

    # --- file -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = SCHEMA_VERSION
        data["restart_totals"] = {r: self.restart_totals.get(r, 0) for r in RESTART_REASONS}
        data["restart_totals"].update(self.restart_totals)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SupervisorState:
        known = {f for f in cls.__dataclass_fields__ if f != "restarts"}
        state = cls(**{k: v for k, v in data.items() if k in known})
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
    def load(cls, path: Path) -> SupervisorState:
        """The saved state, or a fresh one if the file is missing or unreadable."""
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return cls()


def read_state_from_env() -> dict[str, Any] | None:
    """The raw state for readers inside the engine; None when not supervised or unreadable."""
    path = os.environ.get(STATE_ENV_VAR)
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
