"""Template variables shared by every dashboard: job, instance, model.

All three default to "All" (regex ``.*``) so a fresh Grafana shows every engine; picking a value
narrows every panel, because each selector in ``queries`` carries the matching matcher.
"""

from __future__ import annotations

from grafanalib.core import REFRESH_ON_TIME_RANGE_CHANGE, Template, Templating

from dashboards.datasource import datasource_ref
from dashboards.queries import INSTANCE_VAR, JOB_VAR, MODEL_LABEL, MODEL_VAR
from exporter.catalog import VLLM_NUM_REQUESTS_RUNNING

ALL_VALUE = ".*"


def _variable(name: str, label: str, query: str) -> Template:
    variable = Template(
        name=name,
        label=label,
        query=query,
        dataSource=datasource_ref(),
        includeAll=True,
        multi=True,
        allValue=ALL_VALUE,
        refresh=REFRESH_ON_TIME_RANGE_CHANGE,
    )
    # Grafana's own spelling of a multi-value variable set to "All".
    variable._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return variable


def label_values_query(metric_selector: str, label: str) -> str:
    """Grafana's Prometheus variable query: the values of ``label`` on matching series."""
    return f"label_values({metric_selector}, {label})"


def variables() -> Templating:
    """job from ``up`` (every scrape target), instance within the job, model from vLLM."""
    running = VLLM_NUM_REQUESTS_RUNNING.name
    return Templating(
        list=[
            _variable(JOB_VAR, "Job", label_values_query("up", "job")),
            _variable(
                INSTANCE_VAR,
                "Instance",
                label_values_query(f'up{{job=~"${JOB_VAR}"}}', "instance"),
            ),
            _variable(
                MODEL_VAR,
                "Model",
                label_values_query(
                    f'{running}{{job=~"${JOB_VAR}", instance=~"${INSTANCE_VAR}"}}', MODEL_LABEL
                ),
            ),
        ]
    )
