"""The host memory source, the memory creep test switch and the supervisor's memory guard, as
units: cgroup limits read from cgroup trees written here (v2 and v1), the risk against the
settled footprint, the board's host slot, the creep's growth and release, and the guard's
decisions (the GPU eager path included, which this CPU machine cannot run for real)."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from prometheus_client import CollectorRegistry

from exporter import catalog
from exporter.host_memory import (
    EngineFootprint,
    HostLimit,
    HostMemoryCollector,
    HostMemoryPlanner,
    HostMemoryReader,
    cgroup_limit,
    process_tree,
    unique_bytes,
)
from exporter.memory_creep import (
    MB,
    MemoryCreep,
    control_path,
    prune_stale,
    read_rate,
    write_rate,
)
from exporter.metrics import WardenMetrics
from exporter.settings import SettingsError, load_settings
from exporter.signals import SignalBoard
from exporter.supervisor_state import SupervisorState
from warden.stack import chaos
from warden.supervisor.memory_guard import MemoryGuard, engine_signals

GIB = 1 << 30


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_limit_is_the_tightest_ancestor_and_page_cache_is_room(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/kubepods/pod1/engine\n")
    root = tmp_path / "sys"
    _write(root / "cgroup.controllers", "cpu memory\n")
    _write(root / "kubepods/pod1/engine/memory.max", "max\n")
    _write(root / "kubepods/pod1/memory.max", f"{8 * GIB}\n")
    _write(root / "kubepods/pod1/memory.current", f"{6 * GIB}\n")
    _write(root / "kubepods/pod1/memory.stat", f"anon 1\ninactive_file {GIB}\n")
    _write(root / "kubepods/memory.max", f"{64 * GIB}\n")
    _write(root / "kubepods/memory.current", f"{10 * GIB}\n")
    limit = cgroup_limit(proc, root, machine_bytes=128 * GIB)
    # 8 GiB limit, 6 GiB used of which 1 GiB is reclaimable page cache: 3 GiB of room.
    assert limit == HostLimit("cgroup", 8 * GIB, 3 * GIB)


def test_cgroup_v1_limit_and_no_limit(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("5:cpu:/\n4:memory:/docker/abc\n0::/\n")
    root = tmp_path / "sys"
    base = root / "memory/docker/abc"
    _write(base / "memory.limit_in_bytes", f"{4 * GIB}\n")
    _write(base / "memory.usage_in_bytes", f"{GIB}\n")
    _write(base / "memory.stat", "cache 5\ntotal_inactive_file 0\n")
    assert cgroup_limit(proc, root, machine_bytes=16 * GIB) == HostLimit("cgroup", 4 * GIB, 3 * GIB)
    # "No limit" (v1's huge number) or a limit above the machine's memory is none.
    _write(base / "memory.limit_in_bytes", "9223372036854771712\n")
    assert cgroup_limit(proc, root, machine_bytes=16 * GIB) is None
    _write(base / "memory.limit_in_bytes", f"{32 * GIB}\n")
    assert cgroup_limit(proc, root, machine_bytes=16 * GIB) is None
    assert cgroup_limit(tmp_path / "missing", root) is None


def test_declared_limit_replaces_the_cgroup_and_the_machine() -> None:
    def cgroup(total: int) -> HostLimit:
        return HostLimit("cgroup", 2 * GIB, GIB)

    used, limit = HostMemoryReader(None, GIB, cgroup=cgroup).read()
    assert limit.kind == "cgroup"
    used, limit = HostMemoryReader(20 * GIB, GIB, cgroup=cgroup).read()
    assert limit.kind == "declared" and limit.room_bytes == 20 * GIB - used
    used, limit = HostMemoryReader(None, GIB, cgroup=lambda total: None).read()
    assert limit.kind == "machine"
    assert limit.limit_bytes == psutil.virtual_memory().total - GIB


def test_unique_bytes_count_this_process_tree_once() -> None:
    processes = process_tree(os.getpid())
    assert processes[0].pid == os.getpid()
    uss = unique_bytes(processes)
    rss = sum(p.memory_info().rss for p in processes)
    assert 0 < uss <= rss, "unique memory: shared pages are not counted per process"


GROWER = """
import sys
held = []
for line in sys.stdin:
    held.append(b"\\x01" * (int(line) << 20))  # touched: resident, anonymous
    print("ok", flush=True)
"""


def test_the_footprint_is_read_exactly_only_when_the_cheap_count_moved_or_it_is_time() -> None:
    """A child that grows on demand: small growth is tracked by the cheap count, a drift past
    the threshold or the period reads the exact USS again (a drift not within the minimum gap
    of the last exact read: estimated meanwhile), and a child that exits is no error."""
    now = [0.0]
    footprint = EngineFootprint(
        os.getpid(), lambda: now[0], exact_every_s=30, drift_bytes=32 << 20, min_gap_s=8
    )
    child = subprocess.Popen(
        [sys.executable, "-c", GROWER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None

    def grow(mib: int) -> None:
        child.stdin.write(f"{mib}\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        assert child.stdout.readline() == "ok\n"  # type: ignore[union-attr]

    try:
        grow(1)
        first = footprint.read()
        assert footprint.exact_reads == 1
        grow(12)  # under the drift: estimated, not read exactly
        now[0] = 5
        estimated = footprint.read()
        assert footprint.exact_reads == 1
        assert abs(estimated - first - (12 << 20)) < (4 << 20), (estimated - first) >> 20
        grow(48)  # past the drift, but within the minimum gap: still estimated
        now[0] = 7
        assert abs(footprint.read() - first - (60 << 20)) < (8 << 20)
        assert footprint.exact_reads == 1
        now[0] = 10  # past the drift and the gap: read exactly
        exact = footprint.read()
        assert footprint.exact_reads == 2
        assert abs(exact - first - (60 << 20)) < (8 << 20), (exact - first) >> 20
        now[0] = 45  # the period: exactly again, nothing grew
        assert abs(footprint.read() - exact) < (4 << 20) and footprint.exact_reads == 3
    finally:
        child.kill()
        child.wait()
    now[0] = 50
    assert footprint.read() < exact - (40 << 20)  # the child is gone: listed again, no error
    assert footprint.exact_reads == 4


def test_risk_is_zero_within_the_settled_footprint_whatever_the_machine() -> None:
    for machine in (16 * GIB, 2048 * GIB):
        planner = HostMemoryPlanner(settle_s=60, started_at=0)
        for t, used in ((0, 2 * GIB), (30, 3 * GIB), (59, int(2.5 * GIB))):
            limit = HostLimit("machine", machine, machine - used)
            assert planner.observe(used, limit, t).risk == 0.0
        settled = planner.observe(3 * GIB, HostLimit("machine", machine, machine - 3 * GIB), 100)
        assert settled.settled and settled.planned_bytes == 3 * GIB and settled.risk == 0.0


def test_risk_is_growth_beyond_the_plan_over_the_growth_the_room_allows() -> None:
    planner = HostMemoryPlanner(settle_s=10, started_at=0)
    limit = 8 * GIB
    planner.observe(4 * GIB, HostLimit("declared", limit, 4 * GIB), 0)
    risk = planner.observe(6 * GIB, HostLimit("declared", limit, 2 * GIB), 20)
    assert risk.planned_bytes == 4 * GIB and math.isclose(risk.risk, 0.5)
    assert planner.observe(8 * GIB, HostLimit("declared", limit, 0), 30).risk == 1.0
    # Another process under the same limit takes room: the same growth is riskier.
    assert math.isclose(planner.observe(6 * GIB, HostLimit("cgroup", limit, GIB), 40).risk, 2 / 3)


def test_collector_publishes_on_the_board_and_metrics_at_most_every_interval(
    tmp_path: Path,
) -> None:
    board = SignalBoard(str(tmp_path / "board"), create=True)
    registry = CollectorRegistry()
    metrics = WardenMetrics(registry)
    samples = iter([4 * GIB, 6 * GIB, 7 * GIB])

    class Reader(HostMemoryReader):
        def read(self) -> tuple[int, HostLimit]:
            used = next(samples)
            return used, HostLimit("declared", 8 * GIB, 8 * GIB - used)

    now = [0.0]
    collector = HostMemoryCollector(
        Reader(None, 0), HostMemoryPlanner(5, 0), metrics, board, 2.0, lambda: now[0]
    )
    collector.collect()
    assert board.read_max(5, 0.5) == {"host": 0.0}
    now[0] = 1.0
    collector.collect()  # within the interval: not measured again
    now[0] = 10.0
    collector.collect()
    assert board.read_max(5, 10.0) == {"host": 0.5}
    assert board.read_max(5, 20.0) == {}, "a stale host sample is no signal"
    value = registry.get_sample_value
    assert value(catalog.MEMORY_RISK.name, {"source": "host"}) == 0.5
    assert value(catalog.HOST_MEMORY_USED.name) == 6 * GIB
    assert value(catalog.HOST_MEMORY_PLANNED.name) == 4 * GIB
    assert value(catalog.HOST_MEMORY_LIMIT.name, {"limit": "declared"}) == 8 * GIB


def test_headroom_declares_the_limit_above_the_settled_footprint() -> None:
    samples = iter([3 * GIB, 3 * GIB, int(3.5 * GIB)])

    class Reader(HostMemoryReader):
        def read(self) -> tuple[int, HostLimit]:
            return next(samples), HostLimit("machine", 64 * GIB, 60 * GIB)

    now = [0.0]
    collector = HostMemoryCollector(
        Reader(None, 0),
        HostMemoryPlanner(5, 0),
        WardenMetrics(CollectorRegistry()),
        None,
        1.0,
        lambda: now[0],
        headroom_bytes=GIB,
    )
    for t in (0.0, 10.0, 20.0):
        now[0] = t
        collector.collect()
    risk = collector.risk
    assert risk is not None and risk.limit == HostLimit("declared", 4 * GIB, GIB // 2)
    assert math.isclose(risk.risk, 0.5)


def test_collector_from_settings_says_the_source_is_available(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    config = load_settings({"WARDEN_HOST_MEMORY_LIMIT_BYTES": str(64 * GIB)})
    collector = HostMemoryCollector.from_settings(config, WardenMetrics(registry), None)
    assert collector is not None
    assert registry.get_sample_value(catalog.SOURCE_AVAILABLE.name, {"source": "host_memory"}) == 1
    collector.collect()
    assert collector.risk is not None and collector.risk.limit.kind == "declared"
    with pytest.raises(SettingsError, match="WARDEN_HOST_MEMORY_LIMIT_BYTES='12'"):
        load_settings({"WARDEN_HOST_MEMORY_LIMIT_BYTES": "12"})


def test_creep_grows_at_the_rate_then_frees_when_off(tmp_path: Path) -> None:
    control = tmp_path / "warden-creep-1"
    assert control_path(123).name == "warden-creep-123"
    creep = MemoryCreep(control, max_bytes=30 * MB)
    creep.tick(1.0)
    assert creep.held_bytes == 0, "no control file: no creep"
    write_rate(control, 8)
    creep.tick(0.5)
    creep.tick(0.5)
    assert creep.held_bytes == 8 * MB
    creep.tick(10.0)
    assert creep.held_bytes == 30 * MB, "never beyond its cap"
    write_rate(control, 0)
    creep.tick(1.0)
    assert creep.held_bytes == 0 and not creep.held
    control.write_text("lots\n")
    assert read_rate(control) == 0.0
    with pytest.raises(ValueError, match="not in 0..1000"):
        write_rate(control, 5000)


def test_stale_control_files_of_gone_engine_cores_are_pruned(tmp_path: Path) -> None:
    mine = tmp_path / f"warden-creep-{os.getpid()}"
    gone = tmp_path / "warden-creep-999999999"
    for path in (mine, gone, tmp_path / "warden-creep-x"):
        write_rate(path, 0)
    assert prune_stale(tmp_path) == 1
    assert mine.exists() and not gone.exists()


def test_the_creep_switch_is_off_unless_set_and_no_deployment_sets_it() -> None:
    assert load_settings({}).test_memory_creep is False
    assert load_settings({"WARDEN_TEST_MEMORY_CREEP": "1"}).test_memory_creep is True
    root = Path(__file__).resolve().parent.parent
    for folder in ("compose", "deploy", "config"):
        for path in (root / folder).rglob("*"):
            if path.is_file():
                assert "WARDEN_TEST_" not in path.read_text(errors="replace"), path


def test_chaos_creep_refuses_remote_engines_engines_without_the_switch_and_bad_rates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(chaos.ChaosError, match="loopback"):
        chaos.creep("http://10.0.0.1:8000", 10)
    me = psutil.Process()
    monkeypatch.setattr(chaos, "engine_core_for", lambda url, pid=None: me)
    with pytest.raises(chaos.ChaosError, match="without the test switch"):
        chaos.creep("http://127.0.0.1:8000", 10)
    path = control_path(me.pid)
    write_rate(path, 0)
    try:
        assert chaos.creep("http://127.0.0.1:8000", 12.5, out=lambda line: None) == path
        assert read_rate(path) == 12.5
        chaos.creep("http://127.0.0.1:8000", 0, out=lambda line: None)
        assert read_rate(path) == 0
    finally:
        path.unlink()
    parser = argparse.ArgumentParser()
    chaos.add_arguments(parser)
    assert parser.parse_args(["creep", "--off"]).off
    assert parser.parse_args(["creep", "--rate", "25"]).rate == 25
    for bad in (["creep"], ["creep", "--rate", "-1"], ["creep", "--rate", "5", "--off"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_engine_signals_keep_finite_numbers_only() -> None:
    body = {"signals": {"host": 0.5, "device": float("nan"), "x": "a"}}
    assert engine_signals(body) == {"host": 0.5}
    assert engine_signals(None) == {} and engine_signals({"signals": 3}) == {}


def test_guard_on_a_gpu_restarts_eager_when_the_creep_comes_back_and_undo_leaves_eager() -> None:
    guard = MemoryGuard(0.9, 0.6, remember_s=3600, cpu_engine=False)
    state = SupervisorState()
    assert guard.check({"allocator": 0.7}, state, 100) is None
    first = guard.check({"allocator": 0.95, "host": 0.2}, state, 100)
    assert first is not None and first.planned and first.source == "allocator"
    assert guard.learn(state, first, 100) is False, "the first time: only remembered"
    assert "and in eager mode" in state.memory_remediation
    again = guard.check({"allocator": 0.61}, state, 1000)
    assert again is not None and "early" in again.detail
    assert guard.learn(state, again, 1000) is True, "came back on a GPU: restart eager"
    state.set_eager(True, guard.eager_reason(again), 1000)
    assert guard.check({"allocator": 0.61}, state, 1000 + 3601 + 1000) is None, "forgotten"
    assert guard.forget(state, 2000) is True and not state.eager
    assert state.memory_restart_risk["allocator"] == 0.9
    # Eager mode set by someone else (the eager-fallback alert) is not undone here.
    state.set_eager(True, "engine policy enforce_eager", 2100)
    assert guard.forget(state, 2100) is False and state.eager
