"""Every file the stack generates: compose's Prometheus config, the trace backend's config and
Grafana datasource, and the Kubernetes manifests. Listed in ``warden.cli.GENERATORS``."""

from __future__ import annotations

from warden.stack.config import render_compose_prometheus_config
from warden.stack.kubernetes import render_manifests
from warden.stack.traces import render_grafana_tempo_datasource, render_tempo_config

COMPOSE_PROMETHEUS_PATH = "compose/prometheus/prometheus.yml"
COMPOSE_TEMPO_PATH = "compose/traces/tempo.yaml"
COMPOSE_TEMPO_DATASOURCE_PATH = "compose/traces/grafana-datasource.yaml"


def render_all() -> dict[str, str]:
    """Repo-relative path -> content, deterministic."""
    files = {
        COMPOSE_PROMETHEUS_PATH: render_compose_prometheus_config(),
        COMPOSE_TEMPO_PATH: render_tempo_config(),
        COMPOSE_TEMPO_DATASOURCE_PATH: render_grafana_tempo_datasource(),
    }
    files.update(render_manifests())
    return files
