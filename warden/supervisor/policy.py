"""The supervisor's decisions as pure functions: why the engine went down, how long to wait
before starting it again, and when to stop trying.

Kept free of processes and clocks so every rule has a fast unit test; the supervisor loop only
feeds it observations and timestamps.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass, field

from exporter.catalog import RESTART_REASONS

# Why an engine was restarted: the label values of warden_engine_restarts_total{reason}.
EXIT, CRASH, STALLED, UNHEALTHY, ENFORCE_EAGER, MANUAL, MEMORY = RESTART_REASONS
# Restarts a person asked for do not count toward the restart-loop circuit.
UNCOUNTED_REASONS: frozenset[str] = frozenset({MANUAL})


def classify_exit(returncode: int | None, vanished: Iterable[str] = ()) -> str:
    """Reason for an engine that went down without the supervisor asking.

    ``returncode`` is the vLLM server's (negative: killed by that signal; None: still
    running); ``vanished`` names child processes (EngineCore, Worker) that disappeared while
    the server ran or as it exited. A non-zero exit code is the server's own failure, stated:
    a server that shuts itself down takes its engine processes down first, so their going
    says nothing more (a server exiting 3 was counted a crash or an exit by when the last poll
    fell). vLLM shuts its server down cleanly (exit code 0) after its engine core dies, so a
    vanished child explains a clean exit, or a server still running: the root cause was the
    crash.
    """
    if returncode is not None and returncode < 0:
        return CRASH
    if returncode is not None and returncode > 0:
        return EXIT
    if any(True for _ in vanished):
        return CRASH
    return EXIT if returncode is not None else UNHEALTHY


def describe_returncode(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


@dataclass(frozen=True)
class Backoff:
    """Delay before restart number ``n`` of one failure episode (n = 1, 2, ...).

    The first restart is immediate (a single crash should cost only the start-up time); each
    further consecutive failure doubles the wait from ``base_s`` up to ``max_s``. An engine
    that stayed ready for ``stable_s`` ends the episode, so the next crash is immediate again.
    """

    base_s: float = 1.0
    max_s: float = 60.0
    stable_s: float = 600.0

    def delay(self, attempt: int) -> float:
        if attempt <= 1:
            return 0.0
        return float(min(self.max_s, self.base_s * 2 ** (attempt - 2)))

    def schedule(self, attempts: int) -> list[float]:
        return [self.delay(n) for n in range(1, attempts + 1)]


@dataclass
class RestartWindow:
    """Restart-loop circuit: at most ``limit`` restarts within ``window_s`` seconds.

    ``history`` holds the unix times of counted restarts (persisted by the supervisor, so the
    budget survives a restart of the supervisor itself). A failure that would need restart
    number ``limit + 1`` within the window opens the circuit instead.
    """

    limit: int = 5
    window_s: float = 3600.0
    history: list[float] = field(default_factory=list)

    def recent(self, now: float) -> list[float]:
        return [t for t in self.history if now - t < self.window_s]

    def allows(self, now: float) -> bool:
        return len(self.recent(now)) < self.limit

    def record(self, now: float) -> None:
        self.history = [*self.recent(now), now]

    def explain(self, now: float) -> str:
        return (
            f"{len(self.recent(now))} restarts in the last {self.window_s:.0f}s "
            f"(limit {self.limit})"
        )
