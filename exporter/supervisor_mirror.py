"""Mirrors the supervisor's state file into the catalog metrics of the engine's API process.

Each engine start gets a fresh multiprocess metrics folder, so a restart counter kept in the
engine would fall back to zero on every restart. The supervisor owns the numbers and writes
them to a JSON file (schema: ``exporter.supervisor_state``); this collector, on the API process's
collector thread, brings this process's metric objects up to date: counters are increased by
the difference to what it already mirrored, each restart duration is observed once (by its
sequence number), the circuit and eager-mode gauges and the memory restart risk are set. Its
first run happens when the stat logger starts, before the server answers its first scrape.
"""

from __future__ import annotations

import os
from pathlib import Path

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.settings import load_settings
from exporter.supervisor_state import SupervisorState


class SupervisorMirror:
    name = "supervisor_mirror"

    def __init__(self, path: str, metrics: WardenMetrics) -> None:
        self.path = path
        self._restarts = metrics.get(catalog.ENGINE_RESTARTS)
        self._duration = metrics.get(catalog.ENGINE_RESTART_DURATION)
        self._circuit = metrics.get(catalog.SUPERVISOR_CIRCUIT_OPEN)
        self._eager = metrics.get(catalog.ENGINE_EAGER_MODE)
        self._restart_risk = metrics.get(catalog.MEMORY_RESTART_RISK)
        self._mirrored: dict[str, float] = {}
        self._last_seq = 0
        self._last_mtime_ns: int | None = None

    @classmethod
    def from_env(cls, metrics: WardenMetrics) -> SupervisorMirror | None:
        """A mirror when this engine runs under ``warden serve``; None otherwise."""
        path = load_settings().supervisor_state
        return cls(str(path), metrics) if path else None

    def collect(self) -> None:
        try:
            mtime_ns = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return
        if mtime_ns == self._last_mtime_ns:
            return
        state = SupervisorState.read(Path(self.path))
        if state is None:
            raise ValueError(f"supervisor state file {self.path} is unreadable")
        self.apply(state)
        self._last_mtime_ns = mtime_ns

    def apply(self, state: SupervisorState) -> None:
        for reason, count in state.all_restart_totals().items():
            total = float(count)
            delta = total - self._mirrored.get(reason, 0.0)
            if delta > 0:
                self._restarts.labels(reason).inc(delta)
            else:
                self._restarts.labels(reason)  # export the reason at its current value
            self._mirrored[reason] = total
        pending = [e for e in state.restarts if e.duration_s is not None and e.seq > self._last_seq]
        for event in sorted(pending, key=lambda e: e.seq):
            assert event.duration_s is not None
            self._duration.observe(event.duration_s)
            self._last_seq = event.seq
        self._circuit.set(1 if state.circuit_open else 0)
        self._eager.set(1 if state.eager else 0)
        for source, risk in state.memory_restart_risk.items():
            self._restart_risk.labels(source).set(risk)
