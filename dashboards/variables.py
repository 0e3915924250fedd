"""Template variables shared by every dashboard: the fleet labels, job, instance, model.

Each defaults to "All" (regex ``.*``, which also matches a label a series does not carry) so a
fresh Grafana shows every engine; picking a value narrows every panel, because each selector in
``queries`` carries the matching matcher. The variables chain: ``cluster`` (and the mixin
config's other fleet labels, such as ``namespace``), then ``job`` among the engine targets
(the config's ``engine_selector``), then ``instance`` within it, then ``model`` from vLLM.
"""

from __future__ import annotations

from grafanalib.core import REFRESH_ON_TIME_RANGE_CHANGE, Template, Templating

from dashboards.datasource import datasource_ref
from dashboards.queries import INSTANCE_VAR, JOB_VAR, MODEL_LABEL, MODEL_VAR, mixin
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


def _selector(name: str, matchers: list[str]) -> str:
    return f"{name}{{{', '.join(matchers)}}}"


def variables(instance: bool = True) -> Templating:
    """Fleet labels, job and instance from ``up`` of the engine targets, model from vLLM;
    ``instance=False`` leaves the instance out (the fleet dashboard)."""
    config = mixin()
    chosen = [config.engine_selector]
    found: list[Template] = []
    for label in config.fleet_labels:
        found.append(
            _variable(label, label.capitalize(), label_values_query(_selector("up", chosen), label))
        )
        chosen = [*chosen, f'{label}=~"${label}"']
    found.append(_variable(JOB_VAR, "Job", label_values_query(_selector("up", chosen), "job")))
    chosen = [*chosen[1:], f'job=~"${JOB_VAR}"']
    if instance:
        found.append(
            _variable(
                INSTANCE_VAR,
                "Instance",
                label_values_query(_selector("up", chosen), "instance"),
            )
        )
        chosen = [*chosen, f'instance=~"${INSTANCE_VAR}"']
    found.append(
        _variable(
            MODEL_VAR,
            "Model",
            label_values_query(_selector(VLLM_NUM_REQUESTS_RUNNING.name, chosen), MODEL_LABEL),
        )
    )
    return Templating(list=found)
