"""The README's reference tables come from the code: ``warden generate --check`` fails when one
differs (a default changed in the settings model, an alert added, a metric renamed)."""

from __future__ import annotations

import argparse
import importlib
import shutil
from pathlib import Path

import pytest

from alerts.rules import ALERT_NAMES
from exporter import catalog
from exporter.settings import WardenSettings, env_name
from warden.cli import readme

# The module, not the ``main`` function warden/cli/__init__.py exports under the same name.
cli_main = importlib.import_module("warden.cli.main")

REPO_ROOT = Path(__file__).resolve().parents[1]


def _readme() -> str:
    return (REPO_ROOT / readme.README).read_text(encoding="utf-8")


def test_readme_tables_are_up_to_date() -> None:
    assert readme.render_readme(_readme()) == _readme(), "run `warden generate`"


def test_every_setting_metric_and_alert_is_in_the_readme() -> None:
    text = _readme()
    for name in WardenSettings.model_fields:
        assert f"`{env_name(name)}`" in text, name
    for metric in catalog.WARDEN:
        assert f"`{metric.name}`" in text, metric.name
    for alert in ALERT_NAMES:
        assert f"`{alert}`" in text, alert


def _check(root: Path) -> int:
    args = argparse.Namespace(config=None, root=str(root), check=True, out=None)
    return cli_main.cmd_generate(args)


def test_generate_check_fails_when_a_readme_default_differs_from_the_settings_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only the README generator, on a copy of the repository's README.
    monkeypatch.setattr(cli_main, "GENERATORS", ("warden.cli.readme",))
    monkeypatch.setattr(readme, "REPO_ROOT", tmp_path)
    shutil.copy(REPO_ROOT / readme.README, tmp_path / readme.README)
    assert _check(tmp_path) == 0

    default = WardenSettings.model_fields["watermark_high"].default
    row = f"| `{env_name('watermark_high')}` | `{default}` |"
    text = (tmp_path / readme.README).read_text(encoding="utf-8")
    assert row in text
    (tmp_path / readme.README).write_text(text.replace(row, "| `WARDEN_WATERMARK_HIGH` | `0.9` |"))
    capsys.readouterr()
    assert _check(tmp_path) == 1
    assert "README.md" in capsys.readouterr().err


def test_a_missing_block_is_an_error() -> None:
    with pytest.raises(ValueError, match="generated:settings"):
        readme.render_readme("# a README without its tables\n")
