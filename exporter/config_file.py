"""One loader for warden's YAML config files: path in, validated pydantic model out.

The control config (``WARDEN_CONFIG``, ``warden.control.config``) and the alerts mixin config
(``warden generate --config``, ``alerts.config``) are both a YAML mapping validated by a
pydantic model. Reading them one way means one way to fail: ``ConfigFileError`` whose message
names the file and every bad field by its path (``thresholds.saturated_for``), never a
traceback. Lives beside ``exporter.settings``, the floor every other package builds on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


class ConfigFileError(ValueError):
    """A config file cannot be read or is invalid; the message names the file and the fields."""


def read_mapping(
    path: str | Path, what: str, error: type[ConfigFileError] = ConfigFileError
) -> dict[str, Any]:
    """The YAML (or JSON) mapping in ``path``; an empty file is an empty mapping."""
    try:
        data: Any = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise error(f"cannot read {what} {path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"invalid {what} {path}: expected a mapping at the top")
    return data


def validate_mapping(
    data: object,
    model: type[Model],
    what: str,
    source: str | Path = "",
    error: type[ConfigFileError] = ConfigFileError,
) -> Model:
    """``data`` validated by ``model``; ``error`` lists each bad field as ``path: reason``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(f"invalid {what} {source}: expected a mapping at the top")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"invalid {what} {source}: {describe(exc)}") from None


def load_model(
    path: str | Path,
    model: type[Model],
    what: str,
    error: type[ConfigFileError] = ConfigFileError,
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Model:
    """The config file at ``path`` as a ``model``; ``prepare`` may drop sections that belong
    to another reader before validation."""
    data = read_mapping(path, what, error)
    if prepare is not None:
        data = prepare(data)
    return validate_mapping(data, model, what, path, error)


def describe(error: ValidationError) -> str:
    """``field.path: reason; ...`` for every problem pydantic found."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or '(top level)'}: {item['msg']}"
        for item in error.errors(include_url=False)
    )
