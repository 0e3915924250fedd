"""The work units the test workers split: modules that must not run side by side share one."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.parallel import (
    ENGINE_MODULES,
    LOAD_CALIBRATED,
    LOAD_CALIBRATED_MODULES,
    OMP_BIND_VARIABLE,
    PLAIN_ENGINE,
    PLAIN_ENGINE_MODULES,
    UNIT_SECONDS,
    UNLISTED_VLLM_UNIT_S,
    VLLM_CHILD_MODULES,
    expected_seconds,
    next_unit_for,
    pytest_collection_modifyitems,
    runs_vllm,
    work_unit,
    worker_core,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_every_listed_module_exists() -> None:
    """A renamed module would silently leave its unit and run beside the others again."""
    for module in (
        PLAIN_ENGINE_MODULES | LOAD_CALIBRATED_MODULES | VLLM_CHILD_MODULES | ENGINE_MODULES
    ):
        assert (REPO_ROOT / module).is_file(), module
    for unit in set(UNIT_SECONDS) - {PLAIN_ENGINE, LOAD_CALIBRATED}:
        assert (REPO_ROOT / unit).is_file(), unit


def test_the_closed_loop_and_the_benchmark_runs_share_one_unit_and_others_keep_their_own() -> None:
    units = {work_unit(f"{module}::test_x") for module in LOAD_CALIBRATED_MODULES}
    assert len(units) == 1
    assert work_unit("tests/test_closed_loop_e2e.py::a") == work_unit(
        "tests/test_benchmarks_smoke.py::b"
    )
    assert work_unit("tests/test_stall_units.py::c") == "tests/test_stall_units.py"
    plain = {work_unit(f"{module}::t") for module in PLAIN_ENGINE_MODULES}
    assert len(plain) == 1 and plain.isdisjoint(units)


def test_each_worker_binds_its_engines_to_a_core_of_its_own_round_robin() -> None:
    assert [worker_core(f"gw{n}", [0, 1]) for n in range(4)] == [0, 1, 0, 1]
    assert worker_core("gw1", [2, 5]) == 5
    assert worker_core("gw0", [3]) == 3


def test_a_worker_beyond_the_cores_takes_only_units_without_engines_then_stops() -> None:
    """On two cores, ``gw0`` and ``gw1`` take the queue's first unit, engines or not; ``gw2``
    (its engines would share a core an engine worker's step on) skips the engine units and
    gets nothing once only those are left."""
    queue = [LOAD_CALIBRATED, "tests/test_container_engine.py", "tests/test_alerts_promtool.py"]
    assert next_unit_for("gw0", 2, queue) == LOAD_CALIBRATED
    assert next_unit_for("gw1", 2, queue[1:]) == "tests/test_container_engine.py"
    assert next_unit_for("gw2", 2, queue) == "tests/test_alerts_promtool.py"
    assert next_unit_for("gw2", 2, [PLAIN_ENGINE, *queue[:2]]) is None
    assert next_unit_for("gw2", 4, queue) == LOAD_CALIBRATED  # four cores: a core of its own
    assert next_unit_for("gw0", 2, []) is None


def test_an_engine_module_missing_from_the_list_fails_collection_with_its_name() -> None:
    """A new engine module not in ``ENGINE_MODULES`` would be handed to the worker without a
    core for its engines: collection names it instead."""
    config = SimpleNamespace(option=SimpleNamespace(numprocesses=None))  # not under xdist
    listed = _Item("tests/test_admission_engine.py::a", marker="engine")
    pytest_collection_modifyitems(config, [listed])  # type: ignore[arg-type, list-item]
    with pytest.raises(pytest.UsageError, match="tests/test_new_engine.py"):
        new = _Item("tests/test_new_engine.py::b", marker="engine")
        pytest_collection_modifyitems(config, [listed, new])  # type: ignore[arg-type, list-item]


def test_an_xdist_worker_has_its_engines_core_in_the_environment_its_engines_inherit() -> None:
    """Under ``scripts/test.sh`` (xdist workers) the engines this worker starts get its core."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return  # a plain pytest run: vLLM's own binding, unchanged
    cores = sorted(os.sched_getaffinity(0))
    assert os.environ[OMP_BIND_VARIABLE] == str(worker_core(worker, cores))


class _Item:
    """Just what ``runs_vllm`` reads of a pytest item."""

    def __init__(self, nodeid: str, marker: str | None = None) -> None:
        self.nodeid, self.marker = nodeid, marker

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == self.marker else None


def test_engine_tests_and_vllm_child_modules_are_queued_as_long_units() -> None:
    (child_module,) = VLLM_CHILD_MODULES
    assert runs_vllm(_Item(f"{child_module}::test_x"))  # type: ignore[arg-type]
    assert runs_vllm(_Item("tests/test_x.py::test_y", marker="engine"))  # type: ignore[arg-type]
    assert not runs_vllm(_Item("tests/test_x.py::test_y"))  # type: ignore[arg-type]


def test_units_are_queued_longest_first_and_unlisted_engine_units_before_short_ones() -> None:
    items = [
        _Item("tests/test_short_units.py::a"),
        _Item("tests/test_new_engine.py::b", marker="engine"),
        _Item("tests/test_stack_native.py::c", marker="engine"),
        _Item("tests/test_closed_loop_e2e.py::d", marker="engine"),
        _Item("tests/test_keepalive_engine.py::e", marker="engine"),
        _Item("tests/test_container_engine.py::f", marker="engine"),
    ]
    order = sorted(items, key=lambda item: -expected_seconds(item))  # type: ignore[arg-type]
    assert [item.nodeid[-1] for item in order] == ["d", "f", "e", "b", "c", "a"]
    assert expected_seconds(items[1]) == UNLISTED_VLLM_UNIT_S  # type: ignore[arg-type]
    assert expected_seconds(items[0]) == 0  # type: ignore[arg-type]
