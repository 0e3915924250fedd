"""One loader for both YAML config files (the control config and the alerts mixin config):
the same refusals, each naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from alerts.config import ConfigError, load_config
from exporter.config_file import ConfigFileError
from warden.control.config import ControlConfigError
from warden.control.config import load_config as load_control_config


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("thresholds:\n  error_ratio_half_open: 2\n", "thresholds.error_ratio_half_open"),
        ("links:\n  nonesuch: 1\n", "links.nonesuch"),
        ("- a list\n", "expected a mapping at the top"),
        ("thresholds: [unclosed\n", "cannot read mixin config"),
    ],
)
def test_the_mixin_config_names_the_file_and_field(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "mixin.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(path) in str(refused.value) and named in str(refused.value)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("leases:\n  ttl_s: -1\n", "leases.ttl_s"),
        ("nonesuch: 1\n", "nonesuch"),
        ("- a list\n", "expected a mapping at the top"),
        ("leases: {unclosed\n", "cannot read warden config"),
    ],
)
def test_the_control_config_names_the_file_and_field(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "warden.yaml"
    path.write_text(text)
    with pytest.raises(ControlConfigError) as refused:
        load_control_config(path)
    assert str(path) in str(refused.value) and named in str(refused.value)


def test_both_refusals_are_one_kind_and_a_missing_file_is_one_too(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    for load in (load_config, load_control_config):
        with pytest.raises(ConfigFileError, match="cannot read .*absent.yaml"):
            load(missing)


def test_an_empty_file_is_the_defaults_and_the_exporter_section_is_left_to_it(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == load_config(empty).model_validate({})
    shared = tmp_path / "warden.yaml"
    shared.write_text("watermark:\n  anything: 1\n")
    assert load_control_config(shared) == load_control_config(empty)
