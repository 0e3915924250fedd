"""Everything generated from alerts/: rules, Alertmanager config, promtool tests.

``render_all()`` maps repo-relative paths to file contents; ``warden generate`` writes them and
``warden generate --check`` fails when a committed file differs.
"""

from __future__ import annotations

from pathlib import Path

from alerts.alertmanager import render_compose_alertmanager_config
from alerts.promtool_tests import render_test_file
from alerts.rules_file import RULE_GROUPS, render_rules
from alerts.scenarios import TEST_FILES

GENERATED_DIR = "alerts/generated"
RULES_PATH = f"{GENERATED_DIR}/rules.yml"
ALERTMANAGER_PATH = f"{GENERATED_DIR}/alertmanager.yml"
TESTS_DIR = f"{GENERATED_DIR}/tests"


def render_all() -> dict[str, str]:
    """Repo-relative path -> file text, deterministic."""
    files = {
        RULES_PATH: render_rules(),
        ALERTMANAGER_PATH: render_compose_alertmanager_config(),
    }
    for test_file in TEST_FILES:
        files[f"{TESTS_DIR}/{test_file.name}"] = render_test_file(
            test_file, "../rules.yml", [group.name for group in RULE_GROUPS]
        )
    return files


def write_all(root: str = ".") -> list[str]:
    """Write every generated file under ``root``; returns the paths written."""
    written = []
    for path, text in render_all().items():
        target = Path(root) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write_all():
        print(written_path)
