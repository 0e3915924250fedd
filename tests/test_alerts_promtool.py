"""The generated rules and Alertmanager config, checked by promtool and amtool themselves.

Renders the promtool unit tests of tests/promtool/ next to a rendered rules.yml, runs them,
and shows they bite: small mutations of the rules (a label value, a band edge, a ``for``, a
threshold, a template) must make them fail.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from alerts.alertmanager import RouteTiming, render_alertmanager_config
from alerts.generate import ALERTMANAGER_PATH, RULES_PATH, render_all
from tests.promtool import TEST_FILES
from tests.promtool.render import render_test_file

pytestmark = pytest.mark.skipif(
    not (shutil.which("promtool") and shutil.which("amtool")),
    reason="promtool and amtool are needed",
)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """render_all() written under a scratch root, laid out as in the repository, and every
    promtool test file rendered next to its rules.yml: once for the module (rendering every
    rule, dashboard and test file is about half a second of CPU)."""
    root = tmp_path_factory.mktemp("rendered")
    for path, text in render_all().items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    rules = root / RULES_PATH
    for test_file in TEST_FILES:
        text = render_test_file(test_file, rules.name)
        (rules.parent / test_file.name).write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def generated(rendered: Path, tmp_path: Path) -> Path:
    """A copy of the rendered files of this test's own: a mutation test rewrites its rules."""
    return Path(shutil.copytree(rendered, tmp_path / "generated"))


def promtool_tests(generated: Path, name: str) -> Path:
    """A rendered promtool test file (it reads the rules.yml beside it)."""
    return (generated / RULES_PATH).parent / name


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_check_rules(generated: Path) -> None:
    result = run("promtool", "check", "rules", generated / RULES_PATH)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_check_rules_rejects_a_broken_expression(generated: Path) -> None:
    rules = generated / RULES_PATH
    text, target = rules.read_text(), "max by (cluster, namespace, instance) ("
    assert target in text
    rules.write_text(text.replace(target, target + "(", 1))
    assert run("promtool", "check", "rules", rules).returncode != 0


@pytest.mark.parametrize("test_file", [f.name for f in TEST_FILES])
def test_promtool_unit_tests(generated: Path, test_file: str) -> None:
    result = run("promtool", "test", "rules", promtool_tests(generated, test_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# (test file, text in rules.yml, replacement): each must break that file's tests.
MUTATIONS = [
    # no hold: an overload swinging in and out of saturation would flap the alert
    (
        "traffic.yml",
        "for: 1m\n        keep_firing_for: 2m\n        labels:\n          severity: warning",
        "for: 1m\n        labels:\n          severity: warning",
    ),
    # the instantaneous flag instead of the last minute's: saturation between scrapes is missed
    (
        "traffic.yml",
        'max_over_time(warden_saturated{job="vllm-warden"}[1m])',
        'warden_saturated{job="vllm-warden"}',
    ),
    (
        "traffic.yml",
        "instance:warden_requests:rejected_ratio_rate5m > 0.5",
        "instance:warden_requests:rejected_ratio_rate5m > 0.7",
    ),
    # raw preemption rate instead of recomputation per finished request
    ("traffic.yml", "per_finished_rate5m > 1", "per_finished_rate5m > 2"),
    # the risk beyond the plan, not raw used/total: a full-by-design device would fire
    (
        "creep.yml",
        "min_over_time(instance_source:warden_memory_risk_ratio:max[2h]) > 0.05",
        "min_over_time(instance_source:warden_memory_risk_ratio:max[2h]) > 0.9",
    ),
    ("memory.yml", "for: 90s", "for: 1m"),
    # no window over the peak gauge: the oscillating overload never fires
    (
        "memory.yml",
        'max_over_time(warden_memory_watermark_peak{job="vllm-warden"}[1m])',
        'warden_memory_watermark_peak{job="vllm-warden"}',
    ),
    # the instantaneous level: spikes the reflex absorbs between scrapes never fire
    (
        "memory.yml",
        "(max_over_time(warden_memory_watermark_peak{",
        "(max_over_time(warden_memory_watermark{",
    ),
    (
        "recording.yml",
        "(max_over_time(warden_memory_watermark_peak{",
        "(max_over_time(warden_memory_watermark{",
    ),
    # a third of the fleet degraded is not enough; two thirds is
    ("fleet.yml", ">= 0.5", ">= 0.7"),
    # a disabled webhook (no token) is not the only way to turn Alertmanager away
    ("fleet.yml", 'outcome=~"unauthorized|disabled|', 'outcome=~"disabled|'),
    # nor a wrong token: an alert refused on its own inside a 200 counts too
    ("fleet.yml", '|malformed|invalid_alert"', '|malformed"'),
    ("faults.yml", "still failed after their last retry", "failed after retries"),
    (
        "liveness.yml",
        "round(instance:warden_engine_restarts:increase1h) > 5",
        "round(instance:warden_engine_restarts:increase1h) > 6",
    ),
    ("recording.yml", '{outcome!="rejected"}', ""),
]


@pytest.mark.parametrize(("test_file", "old", "new"), MUTATIONS, ids=[m[1] for m in MUTATIONS])
def test_promtool_unit_tests_catch_a_mutation(
    generated: Path, test_file: str, old: str, new: str
) -> None:
    rules = generated / RULES_PATH
    text = rules.read_text()
    assert text.count(old) == 1, f"mutation target {old!r} must occur exactly once"
    rules.write_text(text.replace(old, new))
    result = run("promtool", "test", "rules", promtool_tests(generated, test_file))
    assert result.returncode != 0, f"tests still pass with {old!r} -> {new!r}"
    assert "FAILED" in result.stdout + result.stderr


def test_amtool_check_config_committed(generated: Path) -> None:
    result = run("amtool", "check-config", generated / ALERTMANAGER_PATH)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 receivers" in result.stdout and "1 inhibit rules" in result.stdout


def test_amtool_check_config_runtime_render(tmp_path: Path) -> None:
    config = tmp_path / "alertmanager.yml"
    config.write_text(
        render_alertmanager_config(
            "http://127.0.0.1:8000/warden/alertmanager",
            str(tmp_path / "token"),
            "http://127.0.0.1:9099/",
            queue_url="http://127.0.0.1:9098/",
            engine_timing=RouteTiming("200ms", "1s", "30s"),
        )
    )
    result = run("amtool", "check-config", config)
    assert result.returncode == 0, result.stdout + result.stderr


def test_amtool_check_config_rejects_a_broken_route(generated: Path) -> None:
    config = generated / ALERTMANAGER_PATH
    config.write_text(config.read_text().replace("receiver: pager", "receiver: nobody", 1))
    assert run("amtool", "check-config", config).returncode != 0
