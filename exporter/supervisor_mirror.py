"""Mirrors the supervisor's state file into the catalog metrics of the engine's API process.

Each engine start gets a fresh multiprocess metrics folder, so a restart counter kept in the
engine would fall back to zero on every restart. The supervisor owns the numbers and writes
them to a JSON file (schema: ``warden.supervisor_state``); this collector, on the API process's
collector thread, brings this process's metric objects up to date: counters are increased by
the difference to what it already mirrored, each restart duration is observed once (by its
sequence number), the circuit and eager-mode gauges are set. Its first run happens when the
stat logger starts, before the server answers its first scrape.
"""

from __future__ import annotations

import json
import os
from typing import Any

from exporter import catalog
from exporter.metrics import WardenMetrics

# Environment variable with the state file's path, set by the supervisor for each engine.
STATE_ENV_VAR = "WARDEN_SUPERVISOR_STATE"


class SupervisorMirror:
    name = "supervisor_mirror"

    def __init__(self, path: str, metrics: WardenMetrics) -> None:
        self.path = path
        self._restarts = metrics.get(catalog.ENGINE_RESTARTS)
        self._duration = metrics.get(catalog.ENGINE_RESTART_DURATION)
        self._circuit = metrics.get(catalog.SUPERVISOR_CIRCUIT_OPEN)
        self._eager = metrics.get(catalog.ENGINE_EAGER_MODE)
        self._mirrored: dict[str, float] = {}
        self._last_seq = 0
        self._last_mtime_ns: int | None = None

    @classmethod
    def from_env(cls, metrics: WardenMetrics) -> SupervisorMirror | None:
        """A mirror when this engine runs under ``warden serve``; None otherwise."""
        path = os.environ.get(STATE_ENV_VAR)
        return cls(path, metrics) if path else None

    def collect(self) -> None:
        try:
            mtime_ns = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return
        if mtime_ns == self._last_mtime_ns:
            return
        with open(self.path) as handle:
            state = json.load(handle)
        self.apply(state)
        self._last_mtime_ns = mtime_ns

    def apply(self, state: dict[str, Any]) -> None:
        for reason, total in (state.get("restart_totals") or {}).items():
            total = float(total)
            delta = total - self._mirrored.get(reason, 0.0)
            if delta > 0:
                self._restarts.labels(reason).inc(delta)
            else:
                self._restarts.labels(reason)  # export the reason at its current value
            self._mirrored[reason] = total
        pending = [
            e
            for e in state.get("restarts") or []
            if e.get("duration_s") is not None and int(e.get("seq", 0)) > self._last_seq
        ]
        for event in sorted(pending, key=lambda e: int(e["seq"])):
            self._duration.observe(float(event["duration_s"]))
            self._last_seq = int(event["seq"])
        self._circuit.set(1 if state.get("circuit_open") else 0)
        self._eager.set(1 if state.get("eager") else 0)
