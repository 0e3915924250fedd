"""The work units the two test workers split: modules that must not run side by side share one."""

from __future__ import annotations

from pathlib import Path

from tests.support.parallel import (
    LOAD_CALIBRATED_MODULES,
    PLAIN_ENGINE_MODULES,
    work_unit,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_every_listed_module_exists() -> None:
    """A renamed module would silently leave its unit and run beside the others again."""
    for module in PLAIN_ENGINE_MODULES | LOAD_CALIBRATED_MODULES:
        assert (REPO_ROOT / module).is_file(), module


def test_the_closed_loop_and_the_benchmark_runs_share_one_unit_and_others_keep_their_own() -> None:
    units = {work_unit(f"{module}::test_x") for module in LOAD_CALIBRATED_MODULES}
    assert len(units) == 1
    assert work_unit("tests/test_closed_loop_e2e.py::a") == work_unit(
        "tests/test_benchmarks_smoke.py::b"
    )
    assert work_unit("tests/test_stall_units.py::c") == "tests/test_stall_units.py"
    plain = {work_unit(f"{module}::t") for module in PLAIN_ENGINE_MODULES}
    assert len(plain) == 1 and plain.isdisjoint(units)
