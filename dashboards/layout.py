"""Placing panels on Grafana's 24-column grid and wrapping them into a warden dashboard.

Dashboards are written as rows of ``(width, panel)`` pairs with one height per row, so the
source reads like the screen and gridPos never overlaps by accident.
"""

from __future__ import annotations

from collections.abc import Sequence

import attr
from grafanalib.core import Annotations, Dashboard, DashboardLink, GridPos, Panel, Time

from dashboards.annotations import event_markers
from dashboards.variables import variables

GRID_COLUMNS = 24
TAG = "warden"


@attr.s(frozen=True)
class Row:
    """Panels side by side, all ``height`` grid units tall."""

    height: int = attr.ib()
    panels: Sequence[tuple[int, Panel]] = attr.ib()


def place(rows: Sequence[Row]) -> list[Panel]:
    """Give each panel its gridPos (rows stacked top to bottom) and a stable id."""
    placed: list[Panel] = []
    y = 0
    for row in rows:
        x = 0
        for width, panel in row.panels:
            if x + width > GRID_COLUMNS:
                raise ValueError(f"row at y={y} is wider than {GRID_COLUMNS} columns")
            grid = GridPos(h=row.height, w=width, x=x, y=y)
            placed.append(attr.evolve(panel, gridPos=grid, id=len(placed) + 1))
            x += width
        y += row.height
    return placed


def warden_dashboard(
    uid: str, title: str, description: str, rows: Sequence[Row], per_instance: bool = True
) -> Dashboard:
    """A dashboard with the shared variables, event markers and links to its siblings;
    ``per_instance=False`` for a fleet view (no instance variable, no per-engine markers)."""
    return Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=[TAG],
        timezone="browser",
        refresh="10s",
        time=Time("now-30m", "now"),
        graphTooltip=1,  # shared crosshair: one cursor across every panel
        schemaVersion=39,
        editable=True,
        templating=variables(instance=per_instance),
        annotations=event_markers() if per_instance else Annotations(list=[]),
        links=[
            DashboardLink(
                title="Warden dashboards",
                tags=[TAG],
                asDropdown=True,
                includeVars=True,
                keepTime=True,
            )
        ],
        panels=place(rows),
    )
