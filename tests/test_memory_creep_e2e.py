"""Memory protection proven on a live engine: a CPU engine under ``warden serve``, real
Prometheus with the generated rules at 1 s intervals, Alertmanager and the local pager, steady
traffic, and a host memory creep injected into the engine core with ``warden chaos creep``.

The limit: this machine's cgroups cannot be relied on to exist or be writable in CI, so the
engine declares it with ``WARDEN_HOST_MEMORY_HEADROOM_BYTES``: its settled host footprint plus
1.2 GB (the host source reads it exactly as a cgroup's limit). The creep is set to reach it in
about 65 s. One engine start serves both halves: first the engine settles and serves with no
creep, and warden must take no action at all; then the creep, and the steps must come in order
(warden/cli/creep_scenario.py: the alert path and the engine path each in order; the fast
time-to-OOM rule pages before the watermark reaches high). The creep and memory groups' alerts
hold 5 s before firing instead of their generated minute or more; expressions and labels are
the generated ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from alerts.rules import CREEP, MEMORY
from exporter import catalog
from exporter.host_memory import SOURCE
from tests.support.engine import free_stack_ports
from warden.cli.creep_scenario import STEPS, CreepScenario
from warden.cli.demo import DEMO_PAGER_TIMING
from warden.cli.scenario import metric_names_seen
from warden.common.outcomes import COMPLETED, FAILED
from warden.stack.config import Intervals
from warden.stack.native import NativeStack, StackSettings

pytestmark = pytest.mark.engine

SETTLE_S = 25
HEADROOM_BYTES = 1_200_000_000
REACH_LIMIT_S = 65.0
QUIET_S = SETTLE_S + 35  # settling, then 35 s settled: longer than the fast alert's floor + for


def test_creep_is_seen_paged_and_restarted_before_the_limit_and_no_creep_no_action(
    tmp_path: Path,
) -> None:
    ports = free_stack_ports()
    settings = StackSettings(
        workdir=tmp_path,
        intervals=Intervals("1s", "1s"),
        pager_timing=DEMO_PAGER_TIMING,
        alert_hold_caps={CREEP.name: 5, MEMORY.name: 5},
        with_grafana=False,
        engine_env={
            "WARDEN_TEST_MEMORY_CREEP": "1",
            "WARDEN_HOST_MEMORY_HEADROOM_BYTES": str(HEADROOM_BYTES),
            "WARDEN_MEMORY_SETTLE_S": str(SETTLE_S),
            "WARDEN_HOST_MEMORY_INTERVAL_S": "1",
        },
        **ports,
    )
    printed: list[str] = []
    with NativeStack(settings, out=printed.append) as stack:
        stack.wait_for_query("up == 1", timeout_s=120)
        stack.wait_for_query(f'warden_source_available{{source="{SOURCE}"}} == 1', timeout_s=60)
        # One client, where the demo has two: the steps need traffic, not load, and the
        # second client's engine steps were a suite-wide cost on two cores.
        scenario = CreepScenario(stack, out=printed.append, reach_limit_s=REACH_LIMIT_S, clients=1)

        # No creep: the engine settles and serves; warden does nothing about memory.
        quiet = scenario.quiet(QUIET_S)
        print(f"\nno creep: {quiet}")
        assert quiet["worst_host_risk"] is not None and quiet["worst_host_risk"] < 0.05, quiet
        assert quiet["restarts"] == {}, quiet
        assert quiet["watermark_transitions"] == [], quiet
        assert quiet["memory_leases"] == [], quiet
        assert quiet["memory_alerts"] == [], quiet
        assert quiet["outcomes"].counts[FAILED] == 0, quiet["outcomes"].failures
        assert quiet["outcomes"].counts[COMPLETED] > 0

        result = scenario.run()
        report = result.report()
        print("\n" + report)
        # Read right after the restart, as the demo's summary is: the run's metrics are there.
        seen = metric_names_seen(stack)
        host = {catalog.HOST_MEMORY_USED, catalog.HOST_MEMORY_PLANNED, catalog.HOST_MEMORY_LIMIT}
        assert {metric.name for metric in host} <= seen, seen

    missing = [name for name in STEPS if result.step(name) is None]
    assert not missing, f"missing {missing}\n{report}"
    assert result.in_order, report
    # The reflex acts within a step of the crossing (the same step's listener call).
    assert result.reflex_delay_s is not None and result.reflex_delay_s < 1.0, report
    # The fast time-to-OOM estimate is the real time left, within a factor of three.
    assert result.estimate_s is not None and result.estimate_left_s is not None, report
    assert result.estimate_left_s / 3 <= result.estimate_s <= result.estimate_left_s * 3, report
    # Drained and restarted before the limit, with the cause recorded.
    draining = result.step("draining")
    assert draining is not None and draining.at < result.limit_at, report
    assert result.restart is not None and result.restart["detail"].startswith("host memory risk")
    assert result.peak_used_bytes < result.limit_bytes, report
    assert result.outcomes.counts[FAILED] == 0, report
    assert result.outcomes.counts[COMPLETED] > 0, report
    # The creep is remembered: if it comes back, the supervisor restarts earlier.
    assert result.restart_risk_after.get("host") == 0.6, result.restart_risk_after
