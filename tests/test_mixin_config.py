"""``warden generate --config FILE --out DIR`` (#12 item 4): a user's own job name, identity
labels and receivers give a working set of rules, Alertmanager config and dashboards.

The story the issue tells: a scrape job called something else than ``vllm-warden`` used to get
``WardenEngineDown`` forever and no other alert. promtool shows both sides on the same input.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.config import DEFAULT, load_config
from alerts.rules_file import render_rules
from alerts.yamltext import dump_yaml
from tests.promtool.render import find_rule

pytestmark = pytest.mark.skipif(
    not (shutil.which("promtool") and shutil.which("amtool")), reason="promtool and amtool"
)

USER_CONFIG = """\
engine_selector: 'job="my-vllm"'
identity_labels: [cluster, namespace, instance]
thresholds:
  fleet_degraded_ratio: 0.3
links:
  grafana_base_url: https://grafana.example.com
receivers:
  engine_webhook_url: http://warden-relay.llm.svc:9095/warden/alertmanager
  token_file: /etc/alertmanager/secrets/warden/token
  pager_url: http://pager.example.com/hook
"""
ENGINE = {"job": "my-vllm", "namespace": "llm", "instance": "vllm-0"}


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("mixin")
    (work / "mixin.yaml").write_text(USER_CONFIG)
    result = run(
        sys.executable, "-m", "warden.cli", "generate", "--config", work / "mixin.yaml",
        "--out", work / "out",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return work / "out"


def test_generates_rules_alertmanager_config_and_dashboards(generated: Path) -> None:
    names = sorted(str(p.relative_to(generated)) for p in generated.rglob("*") if p.is_file())
    assert names == [
        "alertmanager.yml",
        "dashboards/warden-faults.json",
        "dashboards/warden-fleet.json",
        "dashboards/warden-memory.json",
        "dashboards/warden-overview.json",
        "rules.yml",
    ]
    checked = run("promtool", "check", "rules", generated / "rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    am = run("amtool", "check-config", generated / "alertmanager.yml")
    assert am.returncode == 0, am.stdout + am.stderr
    config = yaml.safe_load((generated / "alertmanager.yml").read_text())
    hook = next(r for r in config["receivers"] if r["name"] == "warden-engine")
    assert hook["webhook_configs"][0]["url"].startswith("http://warden-relay.llm.svc:9095/")
    rules = (generated / "rules.yml").read_text()
    assert 'job="vllm-warden"' not in rules and 'up{job="my-vllm"}' in rules
    assert "https://grafana.example.com/d/warden-fleet" in rules
    overview = json.loads((generated / "dashboards/warden-overview.json").read_text())
    job_variable = next(v for v in overview["templating"]["list"] if v["name"] == "job")
    assert 'up{job="my-vllm"' in str(job_variable["query"])


def test_a_bad_config_is_refused_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("identity_labels: [namespace]\n")
    result = run(
        sys.executable, "-m", "warden.cli", "generate", "--config", tmp_path / "bad.yaml",
        "--out", tmp_path / "out",
    )  # fmt: skip
    assert result.returncode == 2
    assert "identity_labels" in result.stderr and "instance" in result.stderr
    assert not (tmp_path / "out").exists()


def _alert(name: str, labels: dict[str, str], description: str, config: Any) -> dict[str, Any]:
    rule = find_rule(name, labels)
    annotations = rule.annotations(config)
    annotations["description"] = description
    return {"exp_labels": labels, "exp_annotations": annotations}


def _promtool_test(rules: Path, alerts: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """Engine vllm-0 of job my-vllm, up all along, stalled from minute 5."""
    labels = ", ".join(f'{k}="{v}"' for k, v in sorted(ENGINE.items()))
    document = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f"up{{{labels}}}", "values": "1x12"},
                    {"series": f"warden_engine_stalled{{{labels}}}", "values": "0x4 1x8"},
                ],
                "alert_rule_test": alerts,
            }
        ],
    }
    test_file = rules.parent / "user-test.yml"
    test_file.write_text(dump_yaml(document))
    return run("promtool", "test", "rules", test_file)


def test_another_job_name_gets_working_alerts_not_engine_down_forever(
    generated: Path, tmp_path: Path
) -> None:
    config = load_config(generated.parent / "mixin.yaml")
    stalled = (
        "The engine on vllm-0 has requests running or waiting and completed no step within the "
        "stall timeout (stalled = 1)."
    )
    engine = {"instance": "vllm-0", "namespace": "llm"}
    mine = _promtool_test(
        generated / "rules.yml",
        [
            {"eval_time": "8m", "alertname": "WardenEngineDown", "exp_alerts": []},
            {
                "eval_time": "8m",
                "alertname": "WardenEngineStalled",
                "exp_alerts": [
                    _alert(
                        "WardenEngineStalled", {**engine, "severity": "critical"}, stalled, config
                    )
                ],
            },
        ],
    )
    assert mine.returncode == 0, mine.stdout + mine.stderr

    # The same engine under the default rules: down forever, and blind to the stall.
    (tmp_path / "rules.yml").write_text(render_rules(DEFAULT))
    down = (
        "Scrapes of engine target  fail (up = 0); an empty instance means no target matches "
        '{job="vllm-warden"} at all.'
    )
    default = _promtool_test(
        tmp_path / "rules.yml",
        [
            {
                "eval_time": "8m",
                "alertname": "WardenEngineDown",
                "exp_alerts": [
                    _alert(
                        "WardenEngineDown",
                        {"job": "vllm-warden", "severity": "critical"},
                        down,
                        DEFAULT,
                    )
                ],
            },
            {"eval_time": "8m", "alertname": "WardenEngineStalled", "exp_alerts": []},
        ],
    )
    assert default.returncode == 0, default.stdout + default.stderr


def test_a_hold_override_regenerates_rules_that_wait_for_it(tmp_path: Path) -> None:
    """``thresholds.engine_stalled_for: 5m``: the same stall (from minute 5) that fires at 8m
    under the default 1m hold is still pending at 8m and fires at 11m, in promtool."""
    (tmp_path / "mixin.yaml").write_text(
        USER_CONFIG.replace("thresholds:\n", "thresholds:\n  engine_stalled_for: 5m\n")
    )
    result = run(
        sys.executable, "-m", "warden.cli", "generate", "--config", tmp_path / "mixin.yaml",
        "--out", tmp_path / "out",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = load_config(tmp_path / "mixin.yaml")
    stalled = (
        "The engine on vllm-0 has requests running or waiting and completed no step within the "
        "stall timeout (stalled = 1)."
    )
    labels = {"instance": "vllm-0", "namespace": "llm", "severity": "critical"}
    firing = [_alert("WardenEngineStalled", labels, stalled, config)]
    tested = _promtool_test(
        tmp_path / "out" / "rules.yml",
        [
            {"eval_time": "8m", "alertname": "WardenEngineStalled", "exp_alerts": []},
            {"eval_time": "11m", "alertname": "WardenEngineStalled", "exp_alerts": firing},
        ],
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_an_absurd_threshold_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("thresholds:\n  saturated_refused_ratio: 1.5\n")
    result = run(
        sys.executable, "-m", "warden.cli", "generate", "--config", tmp_path / "bad.yaml",
        "--out", tmp_path / "out",
    )  # fmt: skip
    assert result.returncode == 2
    assert "thresholds.saturated_refused_ratio" in result.stderr, result.stderr
    assert "less than 1" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()
