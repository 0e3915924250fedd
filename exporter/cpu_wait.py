"""How long the engine's processes waited for a CPU: a starved engine is slow, not hung.

On a shared host (a noisy neighbour, two engines pinned to one core, a container's CPU limit)
an engine step can take many times its usual length while every process of the engine is
working as well as it can. The stall check (``exporter.stall``) must not call that a hang: a
restart frees no CPU. Linux counts, per thread, the time it spent runnable but waiting on a
run queue (``/proc/<pid>/schedstat``, second field, nanoseconds). A thread blocked forever in a
kernel or a collective is not runnable, and one spinning on a free core does not wait, so
that time grows only while the engine is held back by CPU contention.

The reading is the main thread of each engine process inside the step: the thread that runs
the step in the engine core and the model in a worker (a worker between steps spins waiting for
work, and its wait is not the step's). One small file per process, read on the API process's
collector thread once a collection, never on the step path. Where the file is missing (a
kernel without schedstat, another PID namespace), nothing is discounted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

NS_PER_S = 1e9


def run_delay_s(pid: int, proc: Path = Path("/proc")) -> float | None:
    """Seconds the main thread of ``pid`` has waited for a CPU since it started (None: unknown)."""
    try:
        fields = (proc / str(pid) / "schedstat").read_text().split()
        return int(fields[1]) / NS_PER_S
    except (OSError, IndexError, ValueError):
        return None


class StepCpuWait:
    """The CPU wait of the engine during the step now running.

    ``update`` is called once a collection with the running step's start (None between
    steps) and the engine's process ids. The wait of one collection is the largest growth among
    the processes, not their sum: the engine core waits on its worker, so one starved process
    holds back the whole step and two starved at once hold it back once. It restarts at 0 with
    each new step. ``total_s`` adds every collection's wait, step or not, for the counter.
    """

    def __init__(self, read: Callable[[int], float | None] = run_delay_s) -> None:
        self.read = read
        self.step_s = 0.0
        self.total_s = 0.0
        self._step: float | None = None
        self._last: dict[int, float] = {}

    def update(self, step_since: float | None, pids: Iterable[int]) -> float:
        """Seconds waited for a CPU since ``step_since`` was first seen (0 between steps)."""
        now: dict[int, float] = {}
        for pid in pids:
            value = self.read(pid)
            if value is not None:
                now[pid] = value
        grown = max(
            (max(0.0, value - self._last[pid]) for pid, value in now.items() if pid in self._last),
            default=0.0,
        )
        self._last = now
        self.total_s += grown
        if step_since is None or step_since != self._step:
            self._step = step_since
            self.step_s = 0.0  # the new step's wait counts from its first sight
        else:
            self.step_s += grown
        return self.step_s
