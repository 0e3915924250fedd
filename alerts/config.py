"""The mixin's config object: what every rule, route and dashboard is generated from.

Like the monitoring mixins' ``_config``: which series are the engines' (``engine_selector``),
which labels say which engine a series or an alert is about (``identity_labels``), and the links
the annotations carry. Rules never spell a job matcher or a ``by (instance)`` themselves; they
ask the config (``select``, ``by``, ``on``), so a user whose scrape job has another name, or
whose engines run in several namespaces or clusters, regenerates everything from one file
(``warden generate --config FILE``) instead of editing rules.

``thresholds`` (``alerts.thresholds.Thresholds``) holds every threshold and hold of the rules.

``DEFAULT`` matches the stacks this repository ships (compose, ``warden up``): they scrape the
engine under ``ENGINE_JOB``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from alerts.thresholds import Thresholds as Thresholds  # re-exported: part of the config
from exporter.catalog import MetricSpec
from exporter.config_file import ConfigFileError, load_model

# Prometheus job names in the stacks this repository generates: the engines, Alertmanager
# (its own metrics: failed notifications), and warden relay.
ENGINE_JOB = "vllm-warden"
ALERTMANAGER_JOB = "alertmanager"
RELAY_JOB = "warden-relay"

Severity = Literal["critical", "warning", "info"]
# critical pages a person, warning goes to a queue, info routes nowhere.
SEVERITIES: tuple[Severity, ...] = ("critical", "warning", "info")

# Where the runbook lives; each alert links to its anchor (GitHub anchors are lowercased names).
RUNBOOK_BASE_URL = "https://github.com/vllm-warden/vllm-warden/blob/main/alerts/runbooks.md"

# Grafana, as the compose stack publishes it, and the dashboards' uids.
GRAFANA_BASE_URL = "http://localhost:3000"
DASHBOARD_OVERVIEW = "warden-overview"
DASHBOARD_MEMORY = "warden-memory"
DASHBOARD_FAULTS = "warden-faults"
DASHBOARD_FLEET = "warden-fleet"
DASHBOARD_UIDS: tuple[str, ...] = (
    DASHBOARD_OVERVIEW,
    DASHBOARD_MEMORY,
    DASHBOARD_FAULTS,
    DASHBOARD_FLEET,
)

_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# One PromQL label matcher: name, operator, double-quoted value.
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:\\.|[^"\\])*)"\s*')


class ConfigError(ConfigFileError):
    """The mixin config file is malformed; the message names the file and the field."""


def parse_matchers(text: str) -> list[tuple[str, str, str]]:
    """``job="a", namespace=~"b"`` -> [(name, op, value), ...]; raises ValueError if it is not
    a comma-separated list of label matchers (what goes between a selector's braces)."""
    matchers, position = [], 0
    while position < len(text):
        match = _MATCHER.match(text, position)
        if match is None:
            raise ValueError(f"not a list of label matchers at {text[position:]!r}")
        matchers.append((match.group(1), match.group(2), match.group(3)))
        position = match.end()
        if position < len(text):
            if text[position] != ",":
                raise ValueError(f"expected ',' between matchers at {text[position:]!r}")
            position += 1
    if not matchers:
        raise ValueError("at least one matcher is needed")
    return matchers


class Links(BaseModel):
    """Where the annotations point: runbooks and Grafana."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runbook_base_url: str = RUNBOOK_BASE_URL
    grafana_base_url: str = GRAFANA_BASE_URL


class Receivers(BaseModel):
    """Where the generated Alertmanager config sends things (unset: the compose stack's).

    In a fleet, ``engine_webhook_url`` is warden relay's (``http://warden-relay:9095/warden/
    alertmanager``): one receiver for every engine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine_webhook_url: str | None = None
    token_file: str | None = None
    pager_url: str | None = None


class MixinConfig(BaseModel):
    """Everything generated from ``alerts/`` and ``dashboards/`` depends on this object only.

    ``engine_selector``: the label matchers that pick the engines' series, as written between
    a selector's braces (``job="vllm-warden"``, ``job=~"vllm-.*", namespace="prod"``).
    ``identity_labels``: the labels that name one engine; every per-engine rule aggregates
    ``by`` them, so two engines never merge, and every per-engine alert carries them, so the
    engine (and the relay) can tell whom an alert is about. ``instance`` must be one of them;
    the others (``cluster``, ``namespace``) also name the fleet a fleet-wide alert is about,
    with ``job``. A label the series do not carry is harmless (it groups as empty).
    ``alertmanager_selector`` / ``relay_selector``: Alertmanager's and warden relay's own
    series, watched for failed deliveries.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine_selector: str = f'job="{ENGINE_JOB}"'
    identity_labels: tuple[str, ...] = ("cluster", "namespace", "instance")
    alertmanager_selector: str = f'job="{ALERTMANAGER_JOB}"'
    relay_selector: str = f'job="{RELAY_JOB}"'
    thresholds: Thresholds = Thresholds()
    links: Links = Links()
    receivers: Receivers = Receivers()

    @field_validator("engine_selector", "alertmanager_selector", "relay_selector")
    @classmethod
    def _selector_parses(cls, value: str) -> str:
        parse_matchers(value)
        return value.strip()

    @field_validator("identity_labels")
    @classmethod
    def _identity_is_label_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for label in value:
            if not _LABEL_NAME.match(label):
                raise ValueError(f"{label!r} is not a label name")
        if len(set(value)) != len(value):
            raise ValueError(f"{list(value)} names a label twice")
        if "instance" not in value:
            raise ValueError("must include instance: the label that names one engine")
        return value

    # --- PromQL helpers every rule uses --------------------------------------------------------
    @property
    def identity(self) -> str:
        """The identity labels as a grouping list: ``cluster, namespace, instance``."""
        return ", ".join(self.identity_labels)

    def by(self, *extra: str) -> str:
        """``by (<identity>, extra...)``: aggregate per engine (and per ``extra`` label)."""
        return f"by ({', '.join((*self.identity_labels, *extra))})"

    def on(self, *extra: str) -> str:
        """``on (<identity>, extra...)``: join two per-engine vectors."""
        return f"on ({', '.join((*self.identity_labels, *extra))})"

    @property
    def fleet_labels(self) -> tuple[str, ...]:
        """The identity labels above one engine (``cluster``, ``namespace``): with ``job`` they
        name a fleet; people's notifications are grouped by them, not per engine."""
        return tuple(label for label in self.identity_labels if label != "instance")

    def by_fleet(self, *extra: str) -> str:
        """``by (<fleet labels>, job, extra...)``: aggregate per fleet (and per ``extra``)."""
        return f"by ({', '.join((*self.fleet_labels, 'job', *extra))})"

    def select(
        self,
        metric: MetricSpec | str,
        selector: str | None = None,
        matchers: str = "",
        **labels: str,
    ) -> str:
        """``name{<engine_selector>, label="value"}``: a raw series of the engines (or of what
        ``selector`` picks); ``matchers`` adds raw ones (``outcome=~"a|b"``)."""
        name = metric.name if isinstance(metric, MetricSpec) else metric
        extra = "".join(f', {key}="{value}"' for key, value in labels.items())
        if matchers:
            extra += f", {matchers}"
        return f"{name}{{{selector or self.engine_selector}{extra}}}"

    def runbook_url(self, alertname: str) -> str:
        """Link to the alert's section in alerts/runbooks.md."""
        return f"{self.links.runbook_base_url}#{alertname.lower()}"

    def dashboard_url(self, uid: str) -> str:
        """Link to a Grafana dashboard by uid."""
        if uid not in DASHBOARD_UIDS:
            raise ValueError(f"unknown dashboard uid {uid!r}")
        return f"{self.links.grafana_base_url}/d/{uid}"


DEFAULT = MixinConfig()

# An expression or annotation that depends on the config: a plain string, or a function of it.
Templated = str | Callable[[MixinConfig], str]


def render(value: Templated, config: MixinConfig) -> str:
    return value(config) if callable(value) else value


def load_config(path: Path | str) -> MixinConfig:
    """Read a YAML (or JSON) mixin config; ``ConfigError`` names the file and each bad field."""
    return load_model(path, MixinConfig, "mixin config", ConfigError)


def runbook_url(alertname: str) -> str:
    """Link to the alert's section in alerts/runbooks.md (default links)."""
    return DEFAULT.runbook_url(alertname)


def dashboard_url(uid: str) -> str:
    """Link to a Grafana dashboard by uid (default links)."""
    return DEFAULT.dashboard_url(uid)
