"""Event markers drawn across every time series panel: degradation changes and restarts.

They are Prometheus annotation queries, so they need nothing besides the metrics: a marker
appears at each evaluation step where the expression returns a series.
"""

from __future__ import annotations

from typing import Any

from grafanalib.core import Annotations

from dashboards.datasource import datasource_ref
from dashboards.queries import increase, selector
from exporter.catalog import DEGRADATION_ACTIVE, ENGINE_RESTARTS

# One annotation step; the change windows below match it so no event is marked twice.
STEP = "1m"


def _annotation(name: str, expr: str, colour: str, title: str, tags: str) -> dict[str, Any]:
    return {
        "datasource": datasource_ref(),
        "enable": True,
        "expr": expr,
        "hide": False,
        "iconColor": colour,
        "name": name,
        "step": STEP,
        "tagKeys": tags,
        "textFormat": "",
        "titleFormat": title,
        "useValueForTime": False,
    }


def degradation_changes() -> dict[str, Any]:
    """A marker whenever a degradation action switched on, off, or changed its value."""
    expr = f"changes({selector(DEGRADATION_ACTIVE)}[{STEP}]) > 0"
    return _annotation("Degradation changes", expr, "orange", "Degradation: {{action}}", "action")


def engine_restarts() -> dict[str, Any]:
    """A marker whenever the supervisor restarted the engine."""
    expr = f"{increase(ENGINE_RESTARTS, by=['instance', 'reason'], window=STEP)} > 0"
    return _annotation("Engine restarts", expr, "red", "Engine restart: {{reason}}", "reason")


def event_markers() -> Annotations:
    """The markers every warden dashboard shows."""
    return Annotations(list=[degradation_changes(), engine_restarts()])
