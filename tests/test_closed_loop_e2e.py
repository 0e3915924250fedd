"""The closed loop end to end: a real engine, Prometheus and Alertmanager at fast intervals
(scrape and evaluation 1 s), the real generated rules and routes, the local pager. The same
scenario ``warden demo`` runs; nothing is faked. The overload is real and calibrated: the
scenario measures what this engine completes per second, then offers 4 times that against the
demo's queue limit, so the refused share lands above the paging threshold on a fast machine and
a slow one alike (warden/cli/scenario.py says why, and why overload and not memory drives the
loop on a CPU engine). The stack is the demo's, holds and control config included."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.closed_loop import STEPS as BENCHMARK_STEPS
from tests.support.engine import free_stack_ports
from warden.cli.demo import demo_settings
from warden.cli.scenario import ClosedLoopScenario
from warden.stack.native import NativeStack

pytestmark = pytest.mark.engine


def test_overload_to_page_to_resolution(tmp_path: Path) -> None:
    ports = free_stack_ports()
    printed: list[str] = []
    settings = demo_settings(tmp_path, with_grafana=False, **ports)
    with NativeStack(settings, out=printed.append) as stack:
        stack.wait_for_query("up == 1", timeout_s=120)
        result = ClosedLoopScenario(stack, out=printed.append).run()
        report = result.report()
        print("\n" + report)
        started = stack.process_ids()
    steps = [step.name for step in result.timeline]
    assert steps[:3] == ["overload", "saturated", "local reflex"], report
    # The calibration and its margins are printed, and the load offered is the stated multiple.
    assert any(line.startswith("calibration: ") for line in printed), printed
    assert result.calibration is not None and result.calibration.capacity.completed > 0
    assert result.calibration.expected_refused_share > result.calibration.threshold, report
    # The timeline is true: each step's time is when it happened, and they are in that order.
    times = [step.at for step in result.timeline]
    assert times[0] == 0.0 and all(t >= 0 for t in times), report
    order = [s.name for s in sorted(result.timeline, key=lambda s: s.at)]
    for before, after in zip(
        (
            "overload",
            "saturated",
            "alert pending",
            "alert firing",
            "alertmanager",
            "overload removed",
        ),
        (
            "saturated",
            "local reflex",
            "alert firing",
            "alertmanager",
            "webhook lease active",
            "resolved",
        ),
        strict=True,
    ):
        assert order.index(before) <= order.index(after), (before, after, report)
    # benchmarks/closed_loop.py reports these steps: it must not wait for one the scenario dropped.
    assert set(BENCHMARK_STEPS) <= set(steps), (BENCHMARK_STEPS, steps)
    for name in (
        "alert pending",
        "alert firing",
        "alertmanager",
        "webhook lease active",
        "page recorded",
        "overload removed",
        "resolved",
        "normal",
    ):
        assert name in steps, report
    # The reflex is the short path: it acts long before the alert path can.
    assert result.step("local reflex").at < result.step("alert firing").at
    assert result.step("webhook lease active").at >= result.step("alert firing").at
    assert result.passed, report
    assert result.outcomes.counts["failed"] == 0, report
    # Nothing the stack started is left running.
    import psutil

    alive = [
        pid
        for pid in started
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert not alive, alive
