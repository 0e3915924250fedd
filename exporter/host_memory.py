"""Host memory of the engine's own processes, against the limit that would really stop them.

Production engines die of host memory too: workers whose resident memory grows under load until
the pod's limit, then the kernel's OOM killer (or Kubernetes eviction, or systemd-oomd) kills
them with every request in flight. This source measures what the engine holds and how close
that is to the limit, so the watermark, the reflex and the supervisor can act before the kill.

- **What the engine holds**: the unique set size (USS) of the API server (this process) and of
  every process below it (engine core, workers): memory that would be freed if the process
  exited. Shared pages (the libraries every process maps) are not counted once per process.
- **The limit**: the memory limit of the engine's cgroup where one is set (cgroup v2
  ``memory.max`` or v1 ``memory.limit_in_bytes``, the tightest of its ancestors), else the
  machine's memory less
  ``WARDEN_HOST_MEMORY_RESERVE_BYTES``. A declared limit replaces both, where no cgroup can be
  made or a person wants a tighter one: ``WARDEN_HOST_MEMORY_LIMIT_BYTES`` (absolute), or
  ``WARDEN_HOST_MEMORY_HEADROOM_BYTES`` (the settled footprint plus this much: a budget for
  growth, whatever the footprint turns out to be); the room is then that limit less what the
  engine holds. With each comes the
  *room* still free under it (the limit less the cgroup's usage without its reclaimable page
  cache; the machine's available memory less the reserve), so other processes under the same
  limit count.
- **The risk** is planned like the device's (exporter/memory_risk.py): the plan is the peak
  footprint the engine reached while it settled after start-up (``WARDEN_MEMORY_SETTLE_S``),
  and the risk is the growth beyond it as a share of the growth the room allows:

      risk = (used - planned) / (used - planned + room)        clamped to [0, 1]

  0 on a healthy engine whatever the machine's size, 1 when the room is gone.

Measuring is cheap between exact reads. The exact USS needs ``smaps_rollup``, for which the
kernel walks every page table of the process, on the API server's CPU (the core the engine
runs on): 40-60 ms per process that maps torch and a KV cache, 150 ms for the three processes
of the tiny model's CPU engine (py-spy, 2026-11-27). So it is read exactly at most every
``EXACT_EVERY_S``, or as soon as the processes' anonymous resident memory (``statm``: counters
the kernel keeps, read in microseconds) moved by ``EXACT_DRIFT_BYTES`` since the last exact
read, but not within ``EXACT_MIN_GAP_S`` of it: a fresh engine's workers grow by hundreds of
MiB as they warm up under their first load (measured: 250 MiB in 25 s on the CPU build). In
between, the used bytes are the last exact USS plus that anonymous growth, which is what a
leak or a creep grows: a creep is seen at once, whatever the period. An exact read only
corrects the estimate for pages that moved between shared and unique (a forked child writing
to pages it shares with its parent), which the anonymous count cannot see; that share is
bounded by the parent's memory at the fork and moves slowly, so ten minutes is soon enough.
History (issue #28): exact reads every 30 s were 3.4% of a warm API server's CPU samples at
8 requests/s; every 120 s, one read still took 3.7% of the samples of a 40 s window at 3
requests/s on a slower machine: in a benchmark run of 20 s that holds one, 150 ms of the API
server's 2.7 s, about 5%.
The process tree is listed again with each exact read (listing scans every process on the host).
All on the collector thread, never on the step path. The risk goes to the signal board's host
slot, which the step monitor reads with the device slots each step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from exporter import catalog
from exporter.memory_risk import MIN_MARGIN_FRACTION, risk_ratio
from exporter.metrics import WardenMetrics
from exporter.settings import WardenSettings, env_name
from exporter.signals import SignalBoard

log = logging.getLogger("warden.exporter")
SOURCE = "host_memory"  # warden_source_available{source}
DECLARED_LIMIT_ENV = env_name("host_memory_limit_bytes")
EXACT_EVERY_S = 600.0  # the exact USS at least this often
EXACT_DRIFT_BYTES = 128 << 20  # and as soon as the cheap count moved this much,
EXACT_MIN_GAP_S = 30.0  # but never twice within this (the estimate tracks the growth meanwhile)
# cgroup v1 writes "no limit" as a huge page-aligned number; anything this large is no limit.
_NO_LIMIT = 1 << 60


@dataclass(frozen=True)
class HostLimit:
    """What bounds the engine's host memory and how much of it is still free."""

    kind: str  # catalog.HOST_LIMIT_KINDS
    limit_bytes: int
    room_bytes: int  # still allocatable before the limit stops the engine


@dataclass(frozen=True)
class HostRisk:
    risk: float
    used_bytes: int
    planned_bytes: int
    limit: HostLimit
    settled: bool


def _read_int(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        text = path.read_text().split()[0]
        return None if text == "max" else int(text)
    return None


def _stat_value(path: Path, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def cgroup_limit(
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    machine_bytes: int | None = None,
) -> HostLimit | None:
    """The tightest memory limit over this process's cgroup and its ancestors (v2, else v1),
    with the room left under it; None when no limit is set (or none below ``machine_bytes``)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    tightest: HostLimit | None = None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "" and (cgroup_root / "cgroup.controllers").exists():
            files = ("memory.max", "memory.current", "memory.stat", "inactive_file")
            base = cgroup_root
        elif "memory" in controllers.split(","):
            files = (
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "memory.stat",
                "total_inactive_file",
            )
            base = cgroup_root / "memory"
        else:
            continue
        limit_file, usage_file, stat_file, reclaimable_key = files
        relative = Path(path.strip().lstrip("/"))
        # In a container the cgroup is usually mounted at the root: the path may not exist.
        candidates = [base / relative, *[base / p for p in relative.parents]]
        for directory in candidates:
            limit = _read_int(directory / limit_file)
            if limit is None or limit >= _NO_LIMIT:
                continue
            if machine_bytes is not None and limit >= machine_bytes:
                continue
            usage = _read_int(directory / usage_file) or 0
            reclaimable = _stat_value(directory / stat_file, reclaimable_key)
            room = max(0, limit - max(0, usage - reclaimable))
            if tightest is None or room < tightest.room_bytes:
                tightest = HostLimit("cgroup", limit, room)
    return tightest


def process_tree(root_pid: int) -> list[psutil.Process]:
    """The engine's processes: the API server and everything below it."""
    root = psutil.Process(root_pid)
    return [root, *root.children(recursive=True)]


def unique_bytes(processes: list[psutil.Process]) -> int:
    """Sum of the processes' unique set sizes; one that exits meanwhile counts 0."""
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            total += int(process.memory_full_info().uss)
    return total


def anonymous_bytes(processes: list[psutil.Process]) -> int:
    """Resident memory not backed by a file or shared (``statm``: resident less shared), summed:
    cheap, and it grows with what a process allocates. Raises NoSuchProcess when one is gone."""
    total = 0
    for process in processes:
        info = process.memory_info()
        total += max(0, int(info.rss) - int(getattr(info, "shared", 0)))
    return total


class EngineFootprint:
    """The engine's unique bytes, read exactly only when the cheap count says it is worth it
    (module docstring): the exact USS, then that plus the anonymous growth since."""

    def __init__(
        self,
        root_pid: int,
        clock: Callable[[], float] = time.monotonic,
        exact_every_s: float = EXACT_EVERY_S,
        drift_bytes: int = EXACT_DRIFT_BYTES,
        min_gap_s: float = EXACT_MIN_GAP_S,
    ) -> None:
        self.root_pid = root_pid
        self.clock = clock
        self.exact_every_s = exact_every_s
        self.drift_bytes = drift_bytes
        self.min_gap_s = min_gap_s
        self.exact_reads = 0
        self._processes: list[psutil.Process] = []
        self._exact_bytes = 0
        self._anonymous_at_exact = 0
        self._next_exact = float("-inf")
        self._last_exact = float("-inf")

    def read(self) -> int:
        now = self.clock()
        if now >= self._next_exact:
            return self._read_exact(now)
        try:
            anonymous = anonymous_bytes(self._processes)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return self._read_exact(now)  # the tree changed: list it again
        drifted = abs(anonymous - self._anonymous_at_exact) >= self.drift_bytes
        if drifted and now - self._last_exact >= self.min_gap_s:
            return self._read_exact(now)
        return max(0, self._exact_bytes + anonymous - self._anonymous_at_exact)

    def _read_exact(self, now: float) -> int:
        self._processes = process_tree(self.root_pid)
        self._exact_bytes = unique_bytes(self._processes)
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            self._anonymous_at_exact = anonymous_bytes(self._processes)
        self._next_exact = now + self.exact_every_s
        self._last_exact = now
        self.exact_reads += 1
        return self._exact_bytes


class HostMemoryReader:
    """One measurement: the engine's unique bytes and the limit that applies to them."""

    def __init__(
        self,
        declared_limit: int | None,
        reserve_bytes: int,
        root_pid: int | None = None,
        cgroup: Callable[[int], HostLimit | None] | None = None,
    ) -> None:
        self.declared_limit = declared_limit
        self.reserve_bytes = reserve_bytes
        self.root_pid = root_pid or os.getpid()
        self.footprint = EngineFootprint(self.root_pid)
        self._cgroup = cgroup or (lambda total: cgroup_limit(machine_bytes=total))

    def read(self) -> tuple[int, HostLimit]:
        used = self.footprint.read()
        vm = psutil.virtual_memory()
        limit: HostLimit | None = None
        if self.declared_limit is not None:
            limit = HostLimit("declared", self.declared_limit, max(0, self.declared_limit - used))
        else:
            limit = self._cgroup(int(vm.total))
        if limit is None:
            total = max(1, int(vm.total) - self.reserve_bytes)
            limit = HostLimit("machine", total, max(0, int(vm.available) - self.reserve_bytes))
        return used, limit


class HostMemoryPlanner:
    """Learns the engine's settled host footprint and turns each sample into a HostRisk."""

    def __init__(self, settle_s: float, started_at: float) -> None:
        self.settle_s = settle_s
        self.started_at = started_at
        self.peak_bytes = 0

    def observe(self, used_bytes: int, limit: HostLimit, now: float) -> HostRisk:
        settled = now - self.started_at >= self.settle_s
        if not settled or self.peak_bytes == 0:
            self.peak_bytes = max(self.peak_bytes, used_bytes)
        planned = self.peak_bytes
        excess = max(0, used_bytes - planned)
        margin = max(excess + limit.room_bytes, int(MIN_MARGIN_FRACTION * limit.limit_bytes))
        risk = risk_ratio(used_bytes, planned, margin)
        return HostRisk(risk, used_bytes, planned, limit, settled)


class HostMemoryCollector:
    """Measures at most every ``interval_s`` (the runner may call it more often) and publishes
    the risk on the signal board's host slot and on /metrics."""

    name = SOURCE

    def __init__(
        self,
        reader: HostMemoryReader,
        planner: HostMemoryPlanner,
        metrics: WardenMetrics,
        board: SignalBoard | None,
        interval_s: float,
        clock: Callable[[], float] = time.time,
        headroom_bytes: int | None = None,
    ) -> None:
        self.reader = reader
        self.headroom_bytes = headroom_bytes
        self.planner = planner
        self.board = board
        self.interval_s = interval_s
        self.clock = clock
        self.risk: HostRisk | None = None
        self._next = 0.0
        self._used = metrics.get(catalog.HOST_MEMORY_USED)
        self._planned = metrics.get(catalog.HOST_MEMORY_PLANNED)
        self._limit = metrics.get(catalog.HOST_MEMORY_LIMIT)
        self._risk = metrics.get(catalog.MEMORY_RISK).labels("host")
        self._limit_kind: str | None = None

    @classmethod
    def from_settings(
        cls, config: WardenSettings, metrics: WardenMetrics, board: SignalBoard | None
    ) -> HostMemoryCollector | None:
        """The collector, or None (logged, source 0) where host memory cannot be read."""
        available = metrics.get(catalog.SOURCE_AVAILABLE).labels(SOURCE)
        reader = HostMemoryReader(config.host_memory_limit_bytes, config.host_memory_reserve_bytes)
        try:
            reader.read()
        except Exception as exc:
            log.warning("warden: host memory unavailable: %r", exc)
            available.set(0)
            return None
        available.set(1)
        planner = HostMemoryPlanner(config.memory_settle_s, time.time())
        return cls(
            reader,
            planner,
            metrics,
            board,
            config.host_memory_interval_s,
            headroom_bytes=config.host_memory_headroom_bytes,
        )

    def collect(self) -> None:
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.interval_s
        used, limit = self.reader.read()
        if self.headroom_bytes is not None:
            planned = self.planner.observe(used, limit, now).planned_bytes
            declared = planned + self.headroom_bytes
            limit = HostLimit("declared", declared, max(0, declared - used))
        risk = self.planner.observe(used, limit, now)
        self.risk = risk
        if self.board is not None:
            self.board.write_host(risk.risk, now)
        self._used.set(used)
        self._planned.set(risk.planned_bytes)
        if self._limit_kind not in (None, limit.kind):
            self._limit.remove(self._limit_kind)
        self._limit_kind = limit.kind
        self._limit.labels(limit.kind).set(limit.limit_bytes)
        self._risk.set(risk.risk)
