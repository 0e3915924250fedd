"""The README's reference tables, generated from the code they describe so they cannot drift.

Four blocks of README.md are written here and nowhere else: the ``WARDEN_*`` settings (from
``exporter.settings.WardenSettings``), the control config's defaults (from
``warden.control.config.ControlConfig``), the metrics (from ``exporter.catalog``) and the alerts
with who gets each (from ``alerts.rules`` and the routing in ``alerts.alertmanager``). Each
block sits between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``; ``warden
generate`` rewrites them and ``warden generate --check`` (run by the test command) fails when
a block differs from what the code says, e.g. after a default changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from alerts.model import AlertRule
from alerts.rules import ALERT_GROUPS
from exporter import catalog
from exporter.settings import WardenSettings, env_name
from warden.control.config import ControlConfig

README = "README.md"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Who gets an alert, by severity (alerts/alertmanager.py routes on it).
RECIPIENT = {
    "critical": "pages a person",
    "warning": "ticket queue",
    "info": "nobody (dashboards only)",
}


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _value(value: object) -> str:
    if value is None or hasattr(value, "get_secret_value"):
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, list | tuple):
        if not value:
            return "none"
        return ", ".join(_value(item) for item in value)
    if isinstance(value, BaseModel):
        return "`" + ", ".join(f"{k}={v}" for k, v in value.model_dump().items()) + "`"
    if value == "":
        return "none"
    return f"`{value}`"


def settings_table() -> str:
    defaults = WardenSettings.model_construct()
    rows = ["| variable | default | what |", "|---|---|---|"]
    for name, field in WardenSettings.model_fields.items():
        value = _value(getattr(defaults, name, None))
        rows.append(f"| `{env_name(name)}` | {_cell(value)} | {_cell(field.description or '')} |")
    return "\n".join(rows)


def _config_leaves(model: BaseModel, prefix: str) -> Iterator[tuple[str, object, FieldInfo]]:
    """Every setting of a config object, dotted, with the value it has and its field."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from _config_leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value, field


def control_config_table() -> str:
    rows = ["| setting | default | what |", "|---|---|---|"]
    for path, value, field in _config_leaves(ControlConfig(), ""):
        rows.append(f"| `{path}` | {_cell(_value(value))} | {_cell(field.description or '')} |")
    return "\n".join(rows)


def metrics_table() -> str:
    rows = ["| metric | type | labels | what |", "|---|---|---|---|"]
    for metric in catalog.ALL:
        if metric.owner != "warden":
            continue
        labels = ", ".join(f"`{label}`" for label in metric.labels) or "-"
        gpu = " (GPU only)" if metric.gpu_only else ""
        rows.append(f"| `{metric.name}` | {metric.kind} | {labels} | {_cell(metric.help)}{gpu} |")
    reused = ", ".join(f"`{m.name}`" for m in catalog.ALL if m.owner == "vllm")
    rows.append("")
    rows.append(f"vLLM's own metrics that warden reads instead of duplicating: {reused}.")
    return "\n".join(rows)


def alerts_table() -> str:
    rows = [
        "| alert | severity | for | who gets it | engine action | summary |",
        "|---|---|---|---|---|---|",
    ]
    for group in ALERT_GROUPS:
        for rule in group.rules:
            if not isinstance(rule, AlertRule):
                continue
            action = f"`{rule.action}`" if rule.action else "-"
            params = ", ".join(f"{k}={v}" for k, v in rule.params.items())
            if params:
                action += f" ({params})"
            hold = rule.render_for()
            rows.append(
                f"| `{rule.name}` | {rule.severity} | {hold} | {RECIPIENT[rule.severity]} "
                f"| {_cell(action)} | {_cell(rule.summary)} |"
            )
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[], str]] = {
    "settings": settings_table,
    "control-config": control_config_table,
    "metrics": metrics_table,
    "alerts": alerts_table,
}


def _block_pattern(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- generated:{re.escape(name)} -->\n)(.*?)(<!-- /generated:{re.escape(name)} -->)",
        re.DOTALL,
    )


def render_readme(text: str) -> str:
    """``text`` with every generated block rewritten; a block missing from it is an error."""
    for name, render in BLOCKS.items():
        pattern = _block_pattern(name)
        match = pattern.search(text)
        if match is None:
            raise ValueError(f"{README} has no <!-- generated:{name} --> block")
        text = text[: match.start(2)] + render() + "\n" + text[match.end(2) :]
    return text


def render_all(root: Path | None = None) -> dict[str, Any]:
    """The generator protocol of ``warden generate``: path -> content."""
    path = (root or REPO_ROOT) / README
    if not path.exists():  # an installed warden, away from its repository
        return {}
    return {README: render_readme(path.read_text(encoding="utf-8"))}
