"""Who had the CPU while admitted requests ran late: the engine's processes and the machine's
cores, read every ``SAMPLE_EVERY_S`` while a client runs.

Runs 47 and 48 of issue #28 (benchmarks/README.md): the admitted requests that missed the SLO
at 4x came in bursts, a few seconds in which requests of every length ran late together and
the rest of the run on time. Whether the model's worker was starved then (by the API
server's refusals on the same core, by the hypervisor: steal) or ran at its full share decides
whether the lateness is warden's to fix or the machine's. The client's records say when each
request ran; this says what the CPU did meanwhile, on the same clock (``time.perf_counter``,
the machine's monotonic clock, which vLLM's client stamps its requests with).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

# Ten reads a second: a burst of late requests lasted about 2 s, a request about 1 s.
SAMPLE_EVERY_S = 0.1
# The keys of a sample besides the engine's roles: the engine's cores, summed (in cores).
MACHINE_KEYS = ("steal", "idle")


def machine_cpu_s(cores: frozenset[int] | None = None) -> dict[str, float]:
    """CPU seconds ``cores`` (None: every core) have spent stolen by the hypervisor and idle
    so far: idle time on the engine's cores while requests ran late says the engine was not
    short of CPU; steal says the machine's host took it."""
    per_core = psutil.cpu_times(percpu=True)
    chosen = [t for i, t in enumerate(per_core) if cores is None or i in cores]
    return {key: float(sum(getattr(t, key, 0.0) for t in chosen)) for key in MACHINE_KEYS}


class CpuTimeline:
    """Cumulative CPU seconds by the engine's roles (``read_roles``: EngineCpu.read) and the
    steal and idle of the engine's ``cores``, read every ``every_s`` while in ``with``; and
    how late each read woke (``lag``: this thread held off the CPU, the client's core
    starved)."""

    def __init__(
        self,
        read_roles: Callable[[], dict[str, float]],
        cores: frozenset[int] | None = None,
        every_s: float = SAMPLE_EVERY_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.read_roles = read_roles
        self.cores = cores
        self.every_s = every_s
        self.clock = clock
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.lags: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-timeline", daemon=True)

    def add(self) -> None:
        """One read: now, and each role's and the machine's CPU seconds so far."""
        self.samples.append((self.clock(), {**self.read_roles(), **machine_cpu_s(self.cores)}))

    def _run(self) -> None:
        due = self.clock() + self.every_s
        while not self._stop.wait(max(0.0, due - self.clock())):
            now = self.clock()
            self.lags.append((now, max(0.0, now - due)))
            with contextlib.suppress(Exception):  # a read that fails leaves a gap, no more
                self.add()
            due = max(due + self.every_s, now)

    def __enter__(self) -> CpuTimeline:
        self.add()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.add()

    def shares(self, start: float, end: float) -> dict[str, float]:
        """Each key's CPU between ``start`` and ``end``, in cores (1.0: one core all the time),
        between the last read at or before ``start`` and the first at or after ``end``; empty
        where the reads do not cover the span."""
        before = [(t, v) for t, v in self.samples if t <= start][-1:]
        after = [(t, v) for t, v in self.samples if t >= end][:1]
        if not before or not after or after[0][0] <= before[0][0]:
            return {}
        (t0, first), (t1, last) = before[0], after[0]
        return {
            key: (last[key] - first[key]) / (t1 - t0)
            for key in first
            if key in last and last[key] == last[key] and first[key] == first[key]  # not NaN
        }

    def longest_lag(self, start: float, end: float) -> float:
        """The latest this thread woke between ``start`` and ``end`` (seconds)."""
        return max((lag for t, lag in self.lags if start <= t <= end), default=0.0)


def cpu_while_running(
    requests: Sequence[tuple[float, float]], slo_s: float, timeline: CpuTimeline
) -> dict[str, dict[str, float]]:
    """The CPU while the requests within the SLO ran, and while the late ones did: for each
    group the number of requests and, per key, the median over its requests of the share
    each request saw (``CpuTimeline.shares`` over its sent-to-answered span), and the
    longest wake-up lag in any of them. ``requests``: (sent, latency) of each answered one."""
    groups: dict[str, list[tuple[float, float]]] = {"on_time": [], "late": []}
    for sent, latency in requests:
        groups["late" if latency > slo_s else "on_time"].append((sent, latency))
    out: dict[str, dict[str, float]] = {}
    for name, members in groups.items():
        if not members:
            continue
        seen = [timeline.shares(sent, sent + latency) for sent, latency in members]
        keys = sorted({key for shares in seen for key in shares})
        summary: dict[str, float] = {"requests": float(len(members))}
        for key in keys:
            values = [shares[key] for shares in seen if key in shares]
            summary[key] = round(statistics.median(values), 3)
        summary["lag_max_s"] = round(
            max(timeline.longest_lag(sent, sent + latency) for sent, latency in members), 3
        )
        out[name] = summary
    return out


def cpu_text(groups: dict[str, Any]) -> str:
    """'late 26: worker 0.61, core 0.12, api 0.27, steal 0.20, idle 0.05, lag 0.31 s; on time
    ...' for a point's ``cpu_while_running``."""
    parts = []
    for name, label in (("late", "late"), ("on_time", "on time")):
        group = groups.get(name)
        if not group:
            continue
        fields = [
            f"{key} {group[key]:.2f}" for key in ("worker", "core", "api", *MACHINE_KEYS)
            if key in group
        ]  # fmt: skip
        fields.append(f"lag {group.get('lag_max_s', 0):.2f} s")
        parts.append(f"{label} {int(group['requests'])}: " + ", ".join(fields))
    return "; ".join(parts)
