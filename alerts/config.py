"""Settings every alert, rule and Alertmanager route is built from, in one place.

Like the monitoring mixins' config object: links and names that several generated files share.
The Prometheus scrape config must use ``ENGINE_JOB`` for the engine target, or
``WardenEngineDown`` watches a job that does not exist.
"""

from __future__ import annotations

from typing import Literal

# Prometheus job name of the vLLM engine target (the engine exporter's /metrics).
ENGINE_JOB = "vllm-warden"

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
DASHBOARD_UIDS: tuple[str, ...] = (DASHBOARD_OVERVIEW, DASHBOARD_MEMORY, DASHBOARD_FAULTS)


def runbook_url(alertname: str) -> str:
    """Link to the alert's section in alerts/runbooks.md."""
    return f"{RUNBOOK_BASE_URL}#{alertname.lower()}"


def dashboard_url(uid: str) -> str:
    """Link to a Grafana dashboard by uid."""
    if uid not in DASHBOARD_UIDS:
        raise ValueError(f"unknown dashboard uid {uid!r}")
    return f"{GRAFANA_BASE_URL}/d/{uid}"
