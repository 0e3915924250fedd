"""Panel builders: modern Grafana panel types, bound to the warden datasource, with units.

grafanalib 0.7.1 still writes Grafana 6 options for the gauge and bar gauge panels, so those two
are small ``Panel`` subclasses here; time series, stat and state timeline use grafanalib's own
classes. Every builder puts the unit in ``fieldConfig.defaults.unit`` and the description an
operator sees on hover, which the dashboard tests check for.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import attr
from grafanalib.core import Panel, Stat, StateTimeline, TimeSeries

from dashboards.datasource import datasource_ref

# Colours by meaning, so every panel paints the same state the same way.
OK = "green"
WARN = "orange"
BAD = "red"
IDLE = "text"
WORST = "purple"

# Stat, gauge and bar gauge show the latest value.
LATEST = "lastNotNull"

Steps = list[dict[str, Any]]
Mappings = list[dict[str, Any]]


@attr.s
class PromTarget:
    """A Prometheus query in the shape Grafana 9+ saves it (grafanalib's adds legacy keys)."""

    expr: str = attr.ib()
    legendFormat: str = attr.ib(default="")
    refId: str = attr.ib(default="")
    instant: bool = attr.ib(default=False)

    def to_json_data(self) -> dict[str, Any]:
        return {
            "datasource": datasource_ref(),
            "editorMode": "code",
            "expr": self.expr,
            "instant": self.instant,
            "legendFormat": self.legendFormat,
            "range": not self.instant,
            "refId": self.refId,
        }


def target(expr: str, legend: str = "", instant: bool = False) -> PromTarget:
    """One query of a panel; ``legend`` uses Grafana's ``{{label}}`` templating."""
    return PromTarget(expr=expr, legendFormat=legend, instant=instant)


def _lettered(targets: Sequence[PromTarget]) -> list[PromTarget]:
    if len(targets) > len(string.ascii_uppercase):
        raise ValueError("too many queries for one panel")
    return [attr.evolve(t, refId=string.ascii_uppercase[i]) for i, t in enumerate(targets)]


def steps(*colour_from: tuple[str, float | None]) -> Steps:
    """Threshold steps: ``("green", None), ("red", 0.9)`` = green below 0.9, red from 0.9."""
    if not colour_from or colour_from[0][1] is not None:
        raise ValueError("the first threshold step is the base and has no value")
    return [{"color": colour, "value": value} for colour, value in colour_from]


BASE: Steps = steps((OK, None))


def value_names(names: Sequence[str], colours: Sequence[str]) -> Mappings:
    """Map the integer codes 0, 1, 2... of an enum-like gauge to names and colours."""
    if len(names) != len(colours):
        raise ValueError("one colour per name")
    options = {
        str(code): {"color": colour, "index": code, "text": name}
        for code, (name, colour) in enumerate(zip(names, colours, strict=True))
    }
    return [{"options": options, "type": "value"}]


def _field_defaults(
    unit: str,
    minimum: float | None = None,
    maximum: float | None = None,
    mappings: Mappings | None = None,
    decimals: int | None = None,
) -> dict[str, Any]:
    """Field options every panel type shares; merged over what grafanalib writes."""
    defaults: dict[str, Any] = {"unit": unit}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if mappings:
        defaults["mappings"] = mappings
    if decimals is not None:
        defaults["decimals"] = decimals
    return {"fieldConfig": {"defaults": defaults}}


def _with_colour_by_thresholds(extra: dict[str, Any]) -> dict[str, Any]:
    extra["fieldConfig"]["defaults"]["color"] = {"mode": "thresholds"}
    return extra


class ModernGauge(Panel):
    """Gauge panel with Grafana 8+ options (single value against min, max and thresholds).

    Adds no attrs fields, so grafanalib's ``Panel`` constructor and ``attr.evolve`` still apply.
    """

    def to_json_data(self) -> dict[str, Any]:
        return self.panel_json(
            {
                "options": {
                    "orientation": "auto",
                    "reduceOptions": {"calcs": [LATEST], "fields": "", "values": False},
                    "showThresholdLabels": False,
                    "showThresholdMarkers": True,
                },
                "type": "gauge",
            }
        )


class ModernBarGauge(Panel):
    """Bar gauge panel with Grafana 8+ options: one bar per series, e.g. per memory source."""

    def to_json_data(self) -> dict[str, Any]:
        return self.panel_json(
            {
                "options": {
                    "displayMode": "gradient",
                    "minVizHeight": 10,
                    "minVizWidth": 0,
                    "orientation": "horizontal",
                    "reduceOptions": {"calcs": [LATEST], "fields": "", "values": False},
                    "showUnfilled": True,
                },
                "type": "bargauge",
            }
        )


def timeseries(
    title: str,
    description: str,
    targets: Sequence[PromTarget],
    unit: str,
    *,
    minimum: float | None = 0,
    maximum: float | None = None,
    thresholds: Steps | None = None,
    stacked: bool = False,
    bars: bool = False,
) -> TimeSeries:
    """Lines over time, one per series; thresholds, when given, are drawn as dashed lines."""
    return TimeSeries(
        title=title,
        description=description,
        dataSource=datasource_ref(),
        targets=_lettered(targets),
        unit=unit,
        thresholds=thresholds or BASE,
        thresholdsStyleMode="dashed" if thresholds else "off",
        drawStyle="bars" if bars else "line",
        fillOpacity=60 if bars else (25 if stacked else 10),
        stacking={"group": "A", "mode": "normal"} if stacked else {},
        showPoints="never",
        tooltipMode="multi",
        tooltipSort="desc",
        extraJson=_field_defaults(unit, minimum, maximum),
    )


def stat(
    title: str,
    description: str,
    targets: Sequence[PromTarget],
    unit: str,
    *,
    thresholds: Steps | None = None,
    mappings: Mappings | None = None,
    sparkline: bool = True,
    decimals: int | None = None,
) -> Stat:
    """One big number per series (the latest value), coloured by thresholds or mappings."""
    return Stat(
        title=title,
        description=description,
        dataSource=datasource_ref(),
        targets=_lettered(targets),
        format=unit,
        thresholds=thresholds or BASE,
        mappings=mappings or [],
        reduceCalc=LATEST,
        graphMode="area" if sparkline else "none",
        colorMode="background" if mappings else "value",
        noValue="no data",
        decimals=decimals,
        extraJson=_with_colour_by_thresholds(
            _field_defaults(unit, mappings=mappings, decimals=decimals)
        ),
    )


def gauge(
    title: str,
    description: str,
    targets: Sequence[PromTarget],
    unit: str,
    *,
    minimum: float,
    maximum: float,
    thresholds: Steps,
) -> ModernGauge:
    """A dial for a level with a known range (a ratio, a fill level)."""
    return ModernGauge(
        title=title,
        description=description,
        dataSource=datasource_ref(),
        targets=_lettered(targets),
        thresholds=thresholds,
        extraJson=_field_defaults(unit, minimum, maximum),
    )


def bar_gauge(
    title: str,
    description: str,
    targets: Sequence[PromTarget],
    unit: str,
    *,
    minimum: float,
    maximum: float,
    thresholds: Steps,
) -> ModernBarGauge:
    """Horizontal bars comparing the same measure across label values."""
    return ModernBarGauge(
        title=title,
        description=description,
        dataSource=datasource_ref(),
        targets=_lettered(targets),
        thresholds=thresholds,
        extraJson=_field_defaults(unit, minimum, maximum),
    )


def state_timeline(
    title: str,
    description: str,
    targets: Sequence[PromTarget],
    unit: str,
    *,
    mappings: Mappings | None = None,
    thresholds: Steps | None = None,
) -> StateTimeline:
    """Coloured bands per series: which state held when (levels, on/off flags)."""
    return StateTimeline(
        title=title,
        description=description,
        dataSource=datasource_ref(),
        targets=_lettered(targets),
        mappings=mappings or [],
        thresholds=thresholds or BASE,
        colorMode="thresholds",
        fillOpacity=80,
        showValue="never",
        tooltipMode="multi",
        extraJson=_field_defaults(unit, mappings=mappings),
    )
