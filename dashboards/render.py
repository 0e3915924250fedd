"""Draw the dashboards from a live Prometheus into PNG files, no Grafana needed.

Each dashboard becomes one image laid out like its Grafana grid: every panel at its gridPos,
with its title, its queries run through Prometheus's HTTP API, values formatted in the panel's
unit, and the dashboard's annotation markers. Good enough to eyeball a run in CI or a bug
report; Grafana remains the real UI.

    warden dashboards render --prometheus http://127.0.0.1:9090 --out run/dashboards
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dashboards import promql
from dashboards.datasource import SCRAPE_INTERVAL
from dashboards.generate import dashboard_models
from dashboards.model import annotation_queries, panel_unit, panels
from dashboards.promapi import PrometheusAPI, QueryError
from dashboards.units import format_value

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)
# matplotlib (and numpy, which it brings) are the optional ``render`` extra: imported where the
# drawing happens, so the rest of dashboards/ works without them.
RENDER_INSTALL = "pip install 'vllm-warden[render]'"


class RenderUnavailable(ImportError):
    """matplotlib, the ``render`` extra, is not installed; the message says how to get it."""


def require_matplotlib() -> None:
    """Raise ``RenderUnavailable`` naming the install command when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
        import numpy  # noqa: F401
    except ModuleNotFoundError as exc:
        raise RenderUnavailable(
            f"drawing dashboards to PNG needs matplotlib ({exc.name} is not installed): "
            f"{RENDER_INSTALL}"
        ) from exc


# Grafana's dark theme, close enough to recognise a panel at a glance.
BACKGROUND = "#111217"
PANEL = "#181b1f"
TEXT = "#ccccdc"
MUTED = "#8e8e8e"
GRID = "#2c3235"
NAMED_COLOURS = {
    "green": "#73BF69",
    "orange": "#FF9830",
    "red": "#F2495C",
    "purple": "#B877D9",
    "blue": "#5794F2",
    "yellow": "#FADE2A",
    "text": MUTED,
}
SERIES_COLOURS = ("#73BF69", "#F2CC0C", "#8AB8FF", "#FF780A", "#F2495C", "#5794F2", "#B877D9")

FIGURE_WIDTH_IN = 20.0
ROW_HEIGHT_IN = 0.42
HEADER_IN = 0.7
POINTS_PER_CHART = 240


@dataclass(frozen=True)
class Window:
    """The time range drawn, the query step, and what ``$__rate_interval`` stands for."""

    start: float
    end: float
    step: float
    rate_interval: str

    @classmethod
    def last(cls, minutes: int, scrape_interval_s: float, now: float | None = None) -> Window:
        end = time.time() if now is None else now
        step = max(1.0, round(minutes * 60 / POINTS_PER_CHART))
        # Grafana: max(4 x scrape interval, step + scrape interval).
        rate = max(4 * scrape_interval_s, step + scrape_interval_s)
        return cls(end - minutes * 60, end, step, f"{int(math.ceil(rate))}s")

    @property
    def grid(self) -> np.ndarray:
        import numpy as np

        count = int(round((self.end - self.start) / self.step)) + 1
        return self.start + self.step * np.arange(count)


@dataclass
class Series:
    name: str
    values: np.ndarray  # aligned with Window.grid, NaN where Prometheus had no sample


@dataclass
class PanelData:
    series: list[Series] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def legend_text(legend_format: str, labels: dict[str, str], expr: str) -> str:
    """Grafana's ``{{label}}`` legend templating, falling back to the label set."""
    if legend_format:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), legend_format)
    shown = {k: v for k, v in labels.items() if k != "__name__"}
    if not shown:
        return labels.get("__name__", expr if len(expr) < 40 else "value")
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(shown.items())) + "}"


def _seconds(duration: str) -> float:
    units = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", duration)
    if not match:
        raise ValueError(f"not a duration: {duration!r}")
    return float(match.group(1)) * units[match.group(2)]


def _aligned(result: list[dict[str, Any]], window: Window) -> list[tuple[dict, np.ndarray]]:
    import numpy as np

    grid = window.grid
    aligned = []
    for item in result:
        values = np.full(grid.shape, np.nan)
        for timestamp, raw in item["values"]:
            index = int(round((float(timestamp) - window.start) / window.step))
            if 0 <= index < len(values):
                values[index] = float(raw)
        aligned.append((item["metric"], values))
    return aligned


def fetch_panel(
    api: PrometheusAPI, panel: dict[str, Any], window: Window, strict: bool
) -> PanelData:
    """Run every query of a panel over the window."""
    data = PanelData()
    variables = promql.all_values(window.rate_interval)
    for target in panel.get("targets", []):
        expr = promql.expand(target["expr"], variables)
        try:
            result = api.query_range(expr, window.start, window.end, window.step)
        except QueryError as exc:
            if strict:
                raise
            log.warning("%s: %s", panel["title"], exc)
            data.errors.append(str(exc))
            continue
        for labels, values in _aligned(result, window):
            name = legend_text(target.get("legendFormat", ""), labels, target["expr"])
            data.series.append(Series(name, values))
    return data


def fetch_markers(
    api: PrometheusAPI, model: dict[str, Any], window: Window, strict: bool
) -> list[tuple[str, str, list[float]]]:
    """(name, colour, times) of each annotation query's hits in the window."""
    markers = []
    colours = {a["name"]: a.get("iconColor", "red") for a in model["annotations"]["list"]}
    variables = promql.all_values(window.rate_interval)
    for name, expr in annotation_queries(model).items():
        step = next(
            (_seconds(a["step"]) for a in model["annotations"]["list"] if a["name"] == name), 60.0
        )
        try:
            result = api.query_range(promql.expand(expr, variables), window.start, window.end, step)
        except QueryError:
            if strict:
                raise
            log.warning("annotation %s failed", name)
            continue
        times = sorted({float(t) for item in result for t, _ in item["values"]})
        markers.append((name, colours[name], times))
    return markers


# --- Colours, mappings and thresholds -------------------------------------------------------
def _colour(name: str) -> str:
    return NAMED_COLOURS.get(name, name)


def _defaults(panel: dict[str, Any]) -> dict[str, Any]:
    return dict(panel.get("fieldConfig", {}).get("defaults", {}))


def mapped(panel: dict[str, Any], value: float) -> tuple[str, str] | None:
    """(text, colour) of a value mapping that matches ``value``, if any."""
    if math.isnan(value) or value != int(value):
        return None
    for mapping in _defaults(panel).get("mappings") or []:
        option = mapping.get("options", {}).get(str(int(value)))
        if mapping.get("type") == "value" and option:
            return option.get("text", str(value)), _colour(option.get("color", "text"))
    return None


def threshold_colour(panel: dict[str, Any], value: float) -> str:
    steps = (_defaults(panel).get("thresholds") or {}).get("steps") or []
    colour = "green"
    for step in steps:
        if step.get("value") is None or (not math.isnan(value) and value >= step["value"]):
            colour = step["color"]
    return _colour(colour)


def value_text(panel: dict[str, Any], value: float) -> tuple[str, str]:
    """What a stat shows for ``value``, and in which colour."""
    hit = mapped(panel, value)
    if hit:
        return hit
    defaults = _defaults(panel)
    text = format_value(value, panel_unit(panel), defaults.get("decimals"))
    return text, threshold_colour(panel, value)


def _last(values: np.ndarray) -> float:
    import numpy as np

    finite = values[~np.isnan(values)]
    return float(finite[-1]) if len(finite) else math.nan


# --- Drawing --------------------------------------------------------------------------------
def _time_axis(ax: Axes, window: Window) -> None:
    from matplotlib.ticker import FuncFormatter

    pattern = "%H:%M:%S" if window.end - window.start <= 600 else "%H:%M"
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda t, _: datetime.fromtimestamp(t).strftime(pattern))
    )
    ax.set_xlim(window.start, window.end)


def _style(ax: Axes) -> None:
    ax.set_facecolor(PANEL)
    ax.tick_params(colors=MUTED, labelsize=6, length=2)
    for spine in ax.spines.values():
        spine.set_color(GRID)
    ax.grid(True, color=GRID, linewidth=0.5)


def _note(ax: Axes, text: str, colour: str = MUTED) -> None:
    ax.text(
        0.5,
        0.5,
        text,
        ha="center",
        va="center",
        color=colour,
        fontsize=8,
        transform=ax.transAxes,
        wrap=True,
    )


def _draw_markers(ax: Axes, markers: Sequence[tuple[str, str, list[float]]]) -> None:
    for _, colour, times in markers:
        for t in times:
            ax.axvline(t, color=_colour(colour), linewidth=0.8, linestyle=":", alpha=0.8)


def draw_timeseries(
    ax: Axes, panel: dict[str, Any], data: PanelData, window: Window, markers: Sequence
) -> None:
    import numpy as np
    from matplotlib.ticker import FuncFormatter

    _style(ax)
    _time_axis(ax, window)
    unit = panel_unit(panel)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, unit)))
    custom = _defaults(panel).get("custom", {})
    grid = window.grid
    stacked = (custom.get("stacking") or {}).get("mode") == "normal"
    bars = custom.get("drawStyle") == "bars"
    base = np.zeros(grid.shape)
    for index, series in enumerate(data.series):
        colour = SERIES_COLOURS[index % len(SERIES_COLOURS)]
        values = series.values
        if stacked:
            values = base + np.nan_to_num(values)
            ax.fill_between(grid, base, values, color=colour, alpha=0.35, linewidth=0)
            base = values
        if bars:
            ax.bar(
                grid,
                np.nan_to_num(series.values),
                width=window.step,
                bottom=0,
                color=colour,
                alpha=0.7,
                label=series.name,
            )
        else:
            ax.plot(grid, values, color=colour, linewidth=1.0, label=series.name)
    defaults = _defaults(panel)
    if (custom.get("thresholdsStyle") or {}).get("mode", "off") != "off":
        for step in (defaults.get("thresholds") or {}).get("steps", []):
            if step.get("value") is not None:
                ax.axhline(
                    step["value"], color=_colour(step["color"]), linestyle="--", linewidth=0.7
                )
    bottom, top = defaults.get("min"), defaults.get("max")
    if bottom is not None or top is not None:
        ax.set_ylim(bottom=bottom, top=top)
    _draw_markers(ax, markers)
    if not data.series:
        _note(ax, "No data")
    elif len(data.series) <= 8:
        ax.legend(fontsize=6, loc="upper left", frameon=False, labelcolor=TEXT, ncol=2)


def draw_state_timeline(
    ax: Axes, panel: dict[str, Any], data: PanelData, window: Window, markers: Sequence
) -> None:
    _style(ax)
    ax.grid(False)
    _time_axis(ax, window)
    grid = window.grid
    for row, series in enumerate(data.series):
        y = len(data.series) - row - 1
        for index, value in enumerate(series.values):
            if math.isnan(value):
                continue
            hit = mapped(panel, float(value))
            colour = hit[1] if hit else threshold_colour(panel, float(value))
            ax.broken_barh([(grid[index], window.step)], (y + 0.1, 0.8), color=colour, linewidth=0)
    ax.set_yticks([len(data.series) - i - 0.5 for i in range(len(data.series))])
    ax.set_yticklabels([s.name for s in data.series], fontsize=6, color=TEXT)
    ax.set_ylim(0, max(1, len(data.series)))
    _draw_markers(ax, markers)
    if not data.series:
        _note(ax, "No data")


def draw_stat(ax: Axes, panel: dict[str, Any], data: PanelData, window: Window) -> None:
    import numpy as np

    ax.set_axis_off()
    if not data.series:
        _note(ax, _defaults(panel).get("noValue") or "No data")
        return
    shown = data.series[:4]
    sparkline = panel.get("options", {}).get("graphMode") == "area"
    for index, series in enumerate(shown):
        left, width = index / len(shown), 1 / len(shown)
        text, colour = value_text(panel, _last(series.values))
        if sparkline:
            spark = ax.inset_axes((left, 0.0, width, 0.35))
            spark.set_axis_off()
            spark.fill_between(
                window.grid, np.nan_to_num(series.values), color=colour, alpha=0.25, linewidth=0
            )
        size = 20 if len(shown) == 1 else 13
        ax.text(
            left + width / 2,
            0.55,
            text,
            ha="center",
            va="center",
            color=colour,
            fontsize=size,
            fontweight="bold",
            transform=ax.transAxes,
        )
        if len(shown) > 1 or series.name not in ("value", ""):
            ax.text(
                left + width / 2,
                0.12,
                series.name[:40],
                ha="center",
                color=MUTED,
                fontsize=6,
                transform=ax.transAxes,
            )


def draw_gauge(ax: Axes, panel: dict[str, Any], data: PanelData, window: Window) -> None:
    """A big number over a bar filled from min to max, in the threshold colour."""
    from matplotlib.patches import Rectangle

    draw_stat(ax, panel, data, window)
    if not data.series:
        return
    defaults = _defaults(panel)
    low, high = float(defaults.get("min", 0)), float(defaults.get("max", 1))
    value = _last(data.series[0].values)
    fraction = 0.0 if math.isnan(value) else min(1.0, max(0.0, (value - low) / (high - low)))
    ax.add_patch(Rectangle((0.1, 0.2), 0.8, 0.08, color=GRID, transform=ax.transAxes))
    ax.add_patch(
        Rectangle(
            (0.1, 0.2),
            0.8 * fraction,
            0.08,
            color=threshold_colour(panel, value),
            transform=ax.transAxes,
        )
    )


def draw_bar_gauge(ax: Axes, panel: dict[str, Any], data: PanelData, window: Window) -> None:
    """One horizontal bar per series, min to max, with its value at the end."""
    from matplotlib.patches import Rectangle

    ax.set_axis_off()
    if not data.series:
        _note(ax, "No data")
        return
    defaults = _defaults(panel)
    low, high = float(defaults.get("min", 0)), float(defaults.get("max", 1))
    count = len(data.series)
    for index, series in enumerate(data.series):
        value = _last(series.values)
        y = 1 - (index + 1) / count
        height = 0.6 / count
        fraction = 0.0 if math.isnan(value) else min(1.0, max(0.0, (value - low) / (high - low)))
        ax.add_patch(
            Rectangle((0.3, y + 0.2 / count), 0.5, height, color=GRID, transform=ax.transAxes)
        )
        ax.add_patch(
            Rectangle(
                (0.3, y + 0.2 / count),
                0.5 * fraction,
                height,
                color=threshold_colour(panel, value),
                transform=ax.transAxes,
            )
        )
        middle = y + 0.5 / count
        ax.text(
            0.28,
            middle,
            series.name[:24],
            ha="right",
            va="center",
            color=TEXT,
            fontsize=7,
            transform=ax.transAxes,
        )
        ax.text(
            0.82,
            middle,
            value_text(panel, value)[0],
            ha="left",
            va="center",
            color=TEXT,
            fontsize=7,
            transform=ax.transAxes,
        )


def _left_padding(kind: str, data: PanelData) -> float:
    """Inches left of a chart for its y labels: state timelines label rows with series names."""
    if kind != "state-timeline":
        return 0.6
    longest = max((len(s.name) for s in data.series), default=4)
    return min(2.2, max(0.6, 0.2 + 0.055 * longest))


def _cell(fig: Figure, grid_pos: dict[str, int], height_in: float) -> tuple[float, ...]:
    """Panel rectangle in figure fractions: left, bottom, width, height."""
    column = FIGURE_WIDTH_IN / 24
    gap = 0.05
    left = (grid_pos["x"] * column + gap) / FIGURE_WIDTH_IN
    width = (grid_pos["w"] * column - 2 * gap) / FIGURE_WIDTH_IN
    top_in = HEADER_IN + grid_pos["y"] * ROW_HEIGHT_IN + gap
    panel_h = grid_pos["h"] * ROW_HEIGHT_IN - 2 * gap
    return left, 1 - (top_in + panel_h) / height_in, width, panel_h / height_in


def render_dashboard(
    api: PrometheusAPI, model: dict[str, Any], window: Window, path: Path, strict: bool = False
) -> Path:
    """Draw one dashboard model to ``path`` (PNG)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    all_panels = panels(model)
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in all_panels)
    height_in = HEADER_IN + rows * ROW_HEIGHT_IN + 0.1
    # A Figure on its own Agg canvas: no pyplot global state, no display needed, thread-safe.
    fig = Figure(figsize=(FIGURE_WIDTH_IN, height_in), facecolor=BACKGROUND)
    FigureCanvasAgg(fig)
    markers = fetch_markers(api, model, window, strict)
    span = (
        f"{datetime.fromtimestamp(window.start):%Y-%m-%d %H:%M:%S} - "
        f"{datetime.fromtimestamp(window.end):%H:%M:%S}"
    )
    fig.text(
        0.01,
        1 - 0.3 / height_in,
        model["title"],
        color=TEXT,
        fontsize=14,
        fontweight="bold",
        va="center",
    )
    legend = "   ".join(f"{name}: {len(times)}" for name, _, times in markers)
    fig.text(
        0.99,
        1 - 0.3 / height_in,
        f"{span}   step {window.step:g}s   markers - {legend}",
        color=MUTED,
        fontsize=8,
        ha="right",
        va="center",
    )
    for panel in all_panels:
        left, bottom, width, height = _cell(fig, panel["gridPos"], height_in)
        fig.add_artist(
            Rectangle(
                (left, bottom),
                width,
                height,
                transform=fig.transFigure,
                facecolor=PANEL,
                edgecolor=GRID,
                linewidth=0.6,
                zorder=-1,
            )
        )
        title_in = 0.28
        fig.text(
            left + 0.06 / FIGURE_WIDTH_IN,
            bottom + height - 0.05 / height_in,
            panel["title"],
            color=TEXT,
            fontsize=8,
            va="top",
        )
        data = fetch_panel(api, panel, window, strict)
        kind = panel["type"]
        charted = kind in ("timeseries", "state-timeline")
        pad_left = _left_padding(kind, data) if charted else 0.1
        pad_bottom = 0.3 if charted else 0.05
        ax = fig.add_axes(
            (
                left + pad_left / FIGURE_WIDTH_IN,
                bottom + pad_bottom / height_in,
                width - (pad_left + 0.12) / FIGURE_WIDTH_IN,
                height - (pad_bottom + title_in) / height_in,
            )
        )
        if kind == "timeseries":
            draw_timeseries(ax, panel, data, window, markers)
        elif kind == "state-timeline":
            draw_state_timeline(ax, panel, data, window, markers)
        elif kind == "gauge":
            draw_gauge(ax, panel, data, window)
        elif kind == "bargauge":
            draw_bar_gauge(ax, panel, data, window)
        else:
            draw_stat(ax, panel, data, window)
        if data.errors:
            _note(ax, "Query error:\n" + "\n".join(e[:120] for e in data.errors), "#F2495C")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=90, facecolor=BACKGROUND)
    return path


def render_dashboards(
    prometheus_url: str,
    out_dir: Path,
    minutes: int = 15,
    dashboards: Iterable[str] | None = None,
    *,
    scrape_interval: str = SCRAPE_INTERVAL,
    strict: bool = False,
    now: float | None = None,
) -> list[Path]:
    """Render each dashboard (all, or the given uids) to ``out_dir/<uid>.png``.

    ``minutes``: how far back the charts go. ``scrape_interval``: the Prometheus scrape
    interval, which sets ``$__rate_interval`` as in Grafana. ``strict``: raise on the first
    failing query instead of drawing the error into its panel. ``RenderUnavailable`` when
    matplotlib (the ``render`` extra) is not installed.
    """
    require_matplotlib()
    models = dashboard_models()
    wanted = list(models) if dashboards is None else list(dashboards)
    unknown = set(wanted) - set(models)
    if unknown:
        raise ValueError(f"unknown dashboard uid(s) {sorted(unknown)}; known: {list(models)}")
    window = Window.last(minutes, _seconds(scrape_interval), now)
    out = Path(out_dir)
    with PrometheusAPI(prometheus_url) as api:
        return [
            render_dashboard(api, models[uid], window, out / f"{uid}.png", strict) for uid in wanted
        ]


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The renderer's options, for a standalone parser or a ``warden`` sub-command."""
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus URL")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNG files")
    parser.add_argument("--minutes", type=int, default=15, help="time range drawn (default 15)")
    parser.add_argument(
        "--dashboard",
        action="append",
        dest="dashboards",
        metavar="UID",
        help="render only this dashboard (repeatable; default: all)",
    )
    parser.add_argument(
        "--scrape-interval",
        default=SCRAPE_INTERVAL,
        help=f"Prometheus scrape interval, sets $__rate_interval (default {SCRAPE_INTERVAL})",
    )
    parser.add_argument("--strict", action="store_true", help="fail on the first query error")
    return parser


def run(args: argparse.Namespace) -> int:
    """Render as parsed by ``add_arguments``; prints the files written."""
    paths = render_dashboards(
        args.prometheus,
        args.out,
        args.minutes,
        args.dashboards,
        scrape_interval=args.scrape_interval,
        strict=args.strict,
    )
    for path in paths:
        print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
