"""How the suite runs on two pytest-xdist workers (a pytest plugin, tests/conftest.py loads it).

Why parallel: most of the suite's time is real engines and real Prometheus/Alertmanager waiting
for scrape and rule intervals, alert holds and restarts, with a core idle; one worker per core
overlaps those waits. ``scripts/test.sh`` runs ``-n 2 --dist loadscope``.

Why whole modules: a module's tests share its module-scoped engine or stack, and a test module is
written to run in its own order. So each module is one work unit, and the modules that share the
session's ``plain_engine`` (``tests/support/shared_engine.py``) are one unit, so that engine
starts once, on one worker (``ModuleScheduling``; xdist's own ``loadgroup`` marks do not reach
the node ids under pytest 9).

Why the load-calibrated modules are one unit: the closed loop's scenario measures the engine's
capacity and then offers a multiple of it, and the benchmark smoke runs saturate engines of
their own. Run side by side, each changes the other's machine between its calibration and its
measurement (a capacity measured under the other's load, then offered to a machine that got
faster, is no overload), so they run one after the other, on one worker.

Why longest first: a run ends when its slower worker does. Units are queued by the seconds they
took in a measured run (``UNIT_SECONDS``), longest first, so each worker takes the longest unit
left when it frees up and the two end close together (longest-processing-time-first). An
unlisted unit that starts engines or runs vLLM in child interpreters (``VLLM_CHILD_MODULES``)
counts as ``UNLISTED_VLLM_UNIT_S``; the short modules fill in at the end, in collection order.

Why each worker's engines run on a core of their own: vLLM's CPU build binds an engine's model
worker to the first core (``VLLM_CPU_OMP_THREADS_BIND=auto`` picks core 0 on any machine this
size, through ``GOMP_CPU_AFFINITY``, from the worker's ``import torch`` on; the suite's forked
worker takes the same binding right after its fork, exporter/fork_engine_processes.py). Two
workers' engines then step, and start, on core 0 while core 1 serves only API servers and
tests: an engine started
beside a busy one took 105-124 s where it takes 45 s alone. Each worker's engines are bound to
core ``N mod cores`` instead (``gwN``); the API servers and engine cores stay unbound.

Why one worker more than there are cores, which starts no engine: with one worker per core, a
core sat idle whenever both workers' engine modules waited on scrape and rule intervals, alert
holds and restarts, while the modules without an engine (promtool, the fake supervisor, vLLM in
child interpreters) waited in the same queue. A worker beyond the cores (``gw2`` on two) would
bind its engines to a core an engine worker's already step on, so it takes only the units that
start none (``ENGINE_MODULES``, checked at collection), and stops when only those are left.
Measured on two cores (2026-11-30): 1,196 s with two workers, 1,088 s with three (an hour
later, on a slower hour, 1,259 s and 1,176 s); the cores
were then busy most of the run (``vmstat``: under 5% idle for its first 11 minutes), the engine
workers' units a little slower each (an engine start beside the third worker's imports took up
to 97 s) and the third worker done after 733 s.

Without xdist (a plain ``pytest tests/test_x.py``) this plugin changes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import pytest

from tests.support.shared_engine import PLAIN_ENGINE

# The modules whose tests use the session's plain engine: one work unit. Collection checks the
# list (a module that starts using the fixture and is not listed fails the run, with this name).
PLAIN_ENGINE_MODULES = frozenset(
    {
        "tests/test_keepalive_engine.py",
        "tests/test_nonfinite_engine.py",
        "tests/test_request_shapes_engine.py",
    }
)


# The modules whose tests start engines (an ``engine`` mark): only the workers whose engines have
# a core of their own take them (``takes_engines``). Collection checks the list: a module that
# starts marking tests ``engine`` and is not listed fails the run, with this name.
ENGINE_MODULES = frozenset(
    {
        "tests/test_admission_engine.py",
        "tests/test_benchmarks_smoke.py",
        "tests/test_closed_loop_e2e.py",
        "tests/test_container_engine.py",
        "tests/test_control_engine.py",
        "tests/test_dashboards_live.py",
        "tests/test_engine_errors_engine.py",
        "tests/test_exporter_engine.py",
        "tests/test_fleet_e2e.py",
        "tests/test_keepalive_engine.py",
        "tests/test_logits_refused_engine.py",
        "tests/test_memory_creep_e2e.py",
        "tests/test_nonfinite_engine.py",
        "tests/test_request_shapes_engine.py",
        "tests/test_slo_engine.py",
        "tests/test_stack_native.py",
        "tests/test_stall_engine.py",
        "tests/test_supervisor_engine.py",
    }
)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


# Modules that calibrate load to this machine's speed, or that saturate it: one work unit.
LOAD_CALIBRATED = "load-calibrated"
LOAD_CALIBRATED_MODULES = frozenset(
    {
        "tests/test_closed_loop_e2e.py",
        "tests/test_benchmarks_smoke.py",
    }
)


def work_unit(nodeid: str) -> str:
    """The unit a test runs in: its module, the plain engine's unit or the load-calibrated."""
    module = module_of(nodeid)
    if module in PLAIN_ENGINE_MODULES:
        return PLAIN_ENGINE
    return LOAD_CALIBRATED if module in LOAD_CALIBRATED_MODULES else module


# Modules without an engine that still run vLLM in child interpreters, one import of vLLM
# (about 8 s of CPU) per test: long units (100-290 s in CI), so they are queued with the
# engine units instead of landing last, alone on one worker.
VLLM_CHILD_MODULES = frozenset({"tests/test_vllm_hooks_units.py"})


def runs_vllm(item: pytest.Item) -> bool:
    """The test starts an engine, or runs vLLM in child interpreters: a long unit."""
    if module_of(item.nodeid) in VLLM_CHILD_MODULES:
        return True
    return item.get_closest_marker("engine") is not None


# Seconds each long unit ran on its worker in a full three-worker run (the balance report this
# plugin prints; 2 cores, 2026-11-30: two engine workers and the one without engines; the
# load-calibrated unit less the engine-free benchmark commands, which run apart since). The
# stall module's engine start varies most (60-130 s, slowed by whatever starts or saturates
# beside it). Only their order matters: a stale figure costs balance, never correctness.
UNIT_SECONDS: dict[str, float] = {
    LOAD_CALIBRATED: 450,
    "tests/test_container_engine.py": 340,
    "tests/test_vllm_hooks_units.py": 304,  # the worker without engines
    "tests/test_memory_creep_e2e.py": 240,
    "tests/test_alerts_promtool.py": 230,  # the worker without engines
    "tests/test_supervisor_engine.py": 177,
    "tests/test_control_engine.py": 176,
    "tests/test_supervisor_fake.py": 142,  # the worker without engines
    "tests/test_dashboards_live.py": 135,
    "tests/test_slo_engine.py": 111,
    "tests/test_fleet_e2e.py": 102,
    "tests/test_stall_engine.py": 90,
    "tests/test_engine_errors_engine.py": 74,
    "tests/test_benchmarks_offline_smoke.py": 70,  # the worker without engines
    "tests/test_exporter_engine.py": 67,
    PLAIN_ENGINE: 66,
    "tests/test_admission_engine.py": 64,
    "tests/test_stack_native.py": 46,
    "tests/test_logits_refused_engine.py": 30,
}
UNLISTED_VLLM_UNIT_S = 60.0  # about one engine start and a few requests


def expected_seconds(item: pytest.Item) -> float:
    """How long the item's work unit is expected to run: the key of the longest-first queue."""
    unit = work_unit(item.nodeid)
    if unit in UNIT_SECONDS:
        return UNIT_SECONDS[unit]
    return UNLISTED_VLLM_UNIT_S if runs_vllm(item) else 0.0


def starts_engines(unit: str) -> bool:
    """Whether a work unit starts engines (the plain engine's and the load-calibrated units are
    made of engine modules)."""
    return unit in (PLAIN_ENGINE, LOAD_CALIBRATED) or unit in ENGINE_MODULES


def takes_engines(worker_id: str, cores: int) -> bool:
    """Whether worker ``gwN`` runs engine units: one worker per core does (``worker_core``);
    those beyond the cores do not."""
    return int(worker_id.removeprefix("gw")) < cores


def next_unit_for(worker_id: str, cores: int, queue: Iterable[str]) -> str | None:
    """The unit a worker takes next from the ``queue`` (longest first): the first, or, for a
    worker beyond the cores, the first that starts no engine; None: nothing left for it."""
    engines = takes_engines(worker_id, cores)
    return next((unit for unit in queue if engines or not starts_engines(unit)), None)


def under_xdist(config: pytest.Config) -> bool:
    """A worker (xdist gives it ``workerinput``) or the controller of ``-n N``."""
    return hasattr(config, "workerinput") or bool(getattr(config.option, "numprocesses", None))


# vLLM's switch for the cores its CPU model worker binds to (vllm/envs.py).
OMP_BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"


def worker_core(worker_id: str, cores: list[int]) -> int:
    """The core a worker's engines are bound to: ``gwN`` gets the Nth core, round robin."""
    return cores[int(worker_id.removeprefix("gw")) % len(cores)]


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or OMP_BIND_VARIABLE in os.environ:
        return  # not an xdist worker, or the binding was chosen by whoever runs the suite
    cores = sorted(os.sched_getaffinity(0))
    # Set in this process's environment: every engine a test starts inherits it.
    os.environ[OMP_BIND_VARIABLE] = str(worker_core(workerinput["workerid"], cores))


# optionalhook: a machine without xdist (the GPU suite's) loads this plugin too.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    cores = len(os.sched_getaffinity(0))

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's load-by-scope, with this file's units as the scopes, in collection order;
        a worker beyond the cores gets the first unit that starts no engine, and stops when
        none is left."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            unit = next_unit_for(node.gateway.id, cores, self.workqueue)
            if unit is None:
                node.shutdown()  # it finishes what it has; the other workers take the rest
                return
            self.workqueue.move_to_end(unit, last=False)  # xdist's own takes the first
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # keep the longest-first order the workers collected
    return ModuleScheduling(config, log)


# Seconds each work unit took, by worker, in the order the worker ran them (the controller's
# view: xdist sends it every test's report). Printed at the end, so a run's balance is visible.
_UNIT_SECONDS = pytest.StashKey[dict[str, dict[str, float]]]()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    worker = getattr(getattr(report, "node", None), "gateway", None)
    config = getattr(getattr(report, "node", None), "config", None)
    if worker is None or config is None:
        return  # not the controller of an xdist run
    units = config.stash.setdefault(_UNIT_SECONDS, {}).setdefault(worker.id, {})
    unit = work_unit(report.nodeid)
    units[unit] = units.get(unit, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    by_worker = config.stash.get(_UNIT_SECONDS, {})
    if not by_worker:
        return
    terminalreporter.section("seconds per work unit, by worker (in the order run)")
    for worker, units in sorted(by_worker.items()):
        terminalreporter.write_line(f"{worker}: {sum(units.values()):.0f} s in all")
        for unit, seconds in units.items():
            if seconds >= 10:
                terminalreporter.write_line(f"  {seconds:6.0f}  {unit}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unlisted = sorted(
        {
            module_of(item.nodeid)
            for item in items
            if PLAIN_ENGINE in getattr(item, "fixturenames", ())
            and module_of(item.nodeid) not in PLAIN_ENGINE_MODULES
        }
    )
    if unlisted:
        raise pytest.UsageError(
            f"{', '.join(unlisted)} use {PLAIN_ENGINE}: add them to PLAIN_ENGINE_MODULES in "
            "tests/support/parallel.py, so that engine starts once under xdist"
        )
    unlisted = sorted(
        {
            module_of(item.nodeid)
            for item in items
            if item.get_closest_marker("engine") is not None
            and module_of(item.nodeid) not in ENGINE_MODULES
        }
    )
    if unlisted:
        raise pytest.UsageError(
            f"{', '.join(unlisted)} start engines: add them to ENGINE_MODULES in "
            "tests/support/parallel.py, so that only a worker with a core for them runs them"
        )
    if under_xdist(config):
        # Longest units first, each unit's tests in their own order (a stable sort keeps it).
        items.sort(key=lambda item: -expected_seconds(item))
