"""Reading a generated dashboard's JSON model: its panels, queries, variables and markers.

The renderer and the tests work from the JSON Grafana would load rather than from the
grafanalib objects, so they check what is shipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

Model = dict[str, Any]


@dataclass(frozen=True)
class PanelQuery:
    """One query of one panel, with what is needed to run it and to name it in a failure."""

    dashboard: str
    panel: str
    ref_id: str
    expr: str
    legend: str
    instant: bool

    @property
    def where(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref_id}"


def panels(model: Model) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    found = []
    for panel in model.get("panels", []):
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def panel_unit(panel: dict[str, Any]) -> str | None:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    return unit if isinstance(unit, str) else None


def panel_queries(model: Model) -> Iterator[PanelQuery]:
    for panel in panels(model):
        for target in panel.get("targets", []):
            yield PanelQuery(
                dashboard=model["uid"],
                panel=panel["title"],
                ref_id=target.get("refId", ""),
                expr=target["expr"],
                legend=target.get("legendFormat", ""),
                instant=bool(target.get("instant", False)),
            )


def variable_queries(model: Model) -> dict[str, str]:
    """Template variable name -> its Prometheus query (``label_values(...)``)."""
    result = {}
    for variable in model.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        result[variable["name"]] = str(query)
    return result


def annotation_queries(model: Model) -> dict[str, str]:
    """Annotation name -> its Prometheus expression."""
    return {
        item["name"]: item["expr"]
        for item in model.get("annotations", {}).get("list", [])
        if "expr" in item
    }
