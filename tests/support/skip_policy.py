"""Under CI a skipped test is a failed test, unless ``tests/skips.py`` lists it with a reason.

A pytest plugin (loaded by ``tests/conftest.py``). Without ``CI`` set to a true value nothing
changes: a developer without Prometheus still gets skips. With ``CI=true`` every skip, at
collection (``pytest.skip(allow_module_level=True)``, ``importorskip``), at setup
(``skipif`` markers, ``pytestmark``) or in the test body (``pytest.skip``), is turned into a
failure that names the skip's reason and where to list it, unless the test's node id or one of
its markers is allowed. Expected failures (``xfail``) are left alone.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterable, Mapping
from typing import Any

import pytest

from tests import skips

CI_TRUE = frozenset({"1", "true", "yes", "on"})


def ci_enabled(env: Mapping[str, str] | None = None) -> bool:
    return (env if env is not None else os.environ).get("CI", "").strip().lower() in CI_TRUE


def allowed_reason(
    nodeid: str,
    markers: Iterable[str],
    tests: Mapping[str, str] | None = None,
    marker_reasons: Mapping[str, str] | None = None,
) -> str | None:
    """Why this test may skip under CI, or None when it may not."""
    tests = skips.ALLOWED_TESTS if tests is None else tests
    marker_reasons = skips.ALLOWED_MARKERS if marker_reasons is None else marker_reasons
    if nodeid in tests:
        return tests[nodeid]
    base = nodeid.split("[", 1)[0]  # every parametrization of a listed test
    if base in tests:
        return tests[base]
    for marker in markers:
        if marker in marker_reasons:
            return marker_reasons[marker]
    return None


def _skip_reason(longrepr: Any) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _failure_text(nodeid: str, reason: str) -> str:
    return (
        f"{nodeid} skipped under CI ({reason}). CI must run every test: install what it needs, "
        "or, if it cannot run on a CI machine by its nature, list it with the reason in "
        "tests/skips.py"
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, why in skips.ALLOWED_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: may skip under CI: {why}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not report.skipped or hasattr(report, "wasxfail") or not ci_enabled():
        return report
    markers = [marker.name for marker in item.iter_markers()]
    if allowed_reason(item.nodeid, markers) is not None:
        return report
    report.outcome = "failed"
    report.longrepr = _failure_text(item.nodeid, _skip_reason(report.longrepr))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if not report.skipped or not ci_enabled():
        return report
    if allowed_reason(collector.nodeid, []) is not None:
        return report
    report.outcome = "failed"
    report.longrepr = _failure_text(collector.nodeid, _skip_reason(report.longrepr))
    return report
