"""Under CI a skip fails the run unless tests/skips.py lists it: the policy on tiny suites.

Each test runs a small pytest session (pytester, in process) with the policy plugin loaded,
once as a developer would (no ``CI``) and once as CI does (``CI=true``).
"""

from __future__ import annotations

import pytest

from tests import skips
from tests.support import skip_policy

PLUGIN = "tests.support.skip_policy"

SUITE = """
import pytest

def test_runs():
    pass

def test_gives_up():
    pytest.skip("could not make the scenario happen")

@pytest.mark.skipif(True, reason="tool missing")
def test_needs_a_tool():
    pass

@pytest.mark.gpu
def test_gpu_only():
    pytest.skip("no CUDA device")

def test_listed():
    pytest.skip("listed with a reason")

@pytest.mark.xfail(reason="known")
def test_known_failure():
    assert False
"""

MODULE_SKIP = """
import pytest
pytest.skip("prometheus not on PATH", allow_module_level=True)

def test_never_collected():
    pass
"""

PYTESTMARK_SKIP = """
import pytest
pytestmark = pytest.mark.skipif(True, reason="promtool and amtool are needed")

def test_one():
    pass

def test_two():
    pass
"""


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        skips, "ALLOWED_TESTS", {"test_suite.py::test_listed": "cannot run on CI by nature"}
    )


def run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None, **files: str
) -> pytest.RunResult:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    if files:
        pytester.makepyfile(**files)
    return pytester.runpytest_inprocess("-p", PLUGIN, "-p", "no:cacheprovider", "-rA")


def test_without_ci_skips_stay_skips(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, listed: None
) -> None:
    result = run(pytester, monkeypatch, None, test_suite=SUITE)
    result.assert_outcomes(passed=1, skipped=4, xfailed=1)


def test_under_ci_an_unlisted_skip_fails_and_says_where_to_list_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, listed: None
) -> None:
    result = run(pytester, monkeypatch, "true", test_suite=SUITE)
    # test_gives_up and test_needs_a_tool fail; the gpu-marked and the listed test may skip.
    result.assert_outcomes(passed=1, failed=1, errors=1, skipped=2, xfailed=1)
    assert result.ret != 0
    text = result.stdout.str()
    assert "test_gives_up skipped under CI (could not make the scenario happen)" in text
    assert "test_needs_a_tool skipped under CI (tool missing)" in text
    assert "tests/skips.py" in text


def test_under_ci_a_module_that_skips_at_collection_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, "true", test_tools=MODULE_SKIP)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*skipped under CI (prometheus not on PATH)*"])
    quiet = run(pytester, monkeypatch, None)
    quiet.assert_outcomes(skipped=1)


def test_under_ci_a_module_wide_skipif_fails_every_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, "1", test_marks=PYTESTMARK_SKIP)
    result.assert_outcomes(errors=2)


@pytest.mark.parametrize(
    ("value", "enabled"),
    [("true", True), ("1", True), ("TRUE", True), ("false", False), ("", False), ("0", False)],
)
def test_ci_values(value: str, enabled: bool) -> None:
    assert skip_policy.ci_enabled({"CI": value}) is enabled
    assert skip_policy.ci_enabled({}) is False


def test_parametrized_ids_follow_their_listed_test() -> None:
    listed = {"tests/t.py::test_x": "why"}
    assert skip_policy.allowed_reason("tests/t.py::test_x[a-1]", [], listed, {}) == "why"
    assert skip_policy.allowed_reason("tests/t.py::test_y", [], listed, {}) is None
    assert skip_policy.allowed_reason("tests/t.py::test_y", ["gpu"], {}, {"gpu": "g"}) == "g"


def test_every_allowed_skip_names_a_real_test_and_a_reason(pytestconfig: pytest.Config) -> None:
    root = pytestconfig.rootpath
    for nodeid, why in skips.ALLOWED_TESTS.items():
        path, _, name = nodeid.partition("::")
        assert why.strip(), nodeid
        assert f"def {name.split('[')[0]}(" in (root / path).read_text(), nodeid
    assert all(why.strip() for why in skips.ALLOWED_MARKERS.values())
