"""Everything generated from alerts/: the rules and the Alertmanager config. (The promtool unit
tests of the rules live in tests/promtool/ and are rendered by the test that runs them.)

``render_all()`` maps repo-relative paths to file contents; ``warden generate`` writes them and
``warden generate --check`` fails when a committed file differs.
"""

from __future__ import annotations

from pathlib import Path

from alerts.alertmanager import render_compose_alertmanager_config
from alerts.rules_file import render_rules

GENERATED_DIR = "alerts/generated"
RULES_PATH = f"{GENERATED_DIR}/rules.yml"
ALERTMANAGER_PATH = f"{GENERATED_DIR}/alertmanager.yml"


def render_all() -> dict[str, str]:
    """Repo-relative path -> file text, deterministic."""
    return {
        RULES_PATH: render_rules(),
        ALERTMANAGER_PATH: render_compose_alertmanager_config(),
    }


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
