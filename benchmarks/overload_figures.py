"""Issue #28's figures, each against its bound, from one overload run's results.

The overload benchmark (benchmarks/overload.py) prints a table per warden configuration. A
run is judged on a handful of numbers from those tables, each with its bound in the issue,
and those were picked out and typed by hand into the README's status table after each run.
Here the benchmark works them out itself, from the same results (so from a saved run's JSON
too: ``python -m benchmarks.overload --report RESULT.json``), each with its value at every
point and whether it is met. Every figure uses the same reading the tables use: the median
pair of a ratio, the pooled share of the pairs' admitted requests, counts summed over the pairs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The points at which the issue asks for nothing to be refused (default: both; SLO: 0.5x).
DEFAULT_NO_REFUSAL = (0.5, 1.0)
SLO_NO_REFUSAL = (0.5,)
# The overloads the SLO figures are judged at (the issue: "at 2x-4x").
OVERLOAD_FROM = 2.0
# The bounds, as the issue gives them.
DEFAULT_TOKENS_MIN = 0.97
DEFAULT_API_CPU_MAX = 1.05
SLO_WITHIN_MIN = 0.99
SLO_TOKENS_MIN = 0.95
SLO_GOODPUT_MIN = 0.9


@dataclass(frozen=True)
class Figure:
    """One of the issue's figures in one run: ``met`` is None where the issue sets no number."""

    name: str
    target: str
    values: tuple[tuple[float, float | None], ...]  # (point, value); None: not measured
    met: bool | None
    digits: int = 2

    def value_text(self) -> str:
        return " / ".join(
            f"{point:g}x {'-' if value is None else f'{value:.{self.digits}f}'}"
            for point, value in self.values
        )


def _runs(results: dict[str, Any], side: str, index: int) -> list[dict[str, Any]]:
    return [sides[side][index] for sides in results["pairs"] if side in sides]


def median_ratio(results: dict[str, Any], side: str, index: int, key: str) -> float | None:
    """warden/plain for ``key`` at one point, the median over the pairs (the tables' value)."""
    ratios = []
    for sides in results["pairs"]:
        warden, plain = sides[side][index].get(key), sides["plain"][index].get(key)
        if warden is not None and plain:
            ratios.append(warden / plain)
    return statistics.median(ratios) if ratios else None


def goodput_share(point: dict[str, Any], capacity: float) -> float:
    """A point's goodput as a share of the capacity measured right before it (the run's
    first capacity for results saved before each point had its own)."""
    return float(point["goodput_per_s"] or 0.0) / point.get("capacity_per_s", capacity)


def pooled_within_share(runs: Sequence[dict[str, Any]]) -> float | None:
    """The share within the SLO of every request the pairs admitted at a point, as one sample
    (each pair's share weighted by its completed requests): a pair's share alone moves by
    a few requests' worth (run 27: 4 misses within 0.1 s of each other made a pair 0.974)."""
    counted = [
        (r["within_slo_share"], r["completed"])
        for r in runs
        if r.get("within_slo_share") is not None and r.get("completed")
    ]
    total = sum(completed for _, completed in counted)
    return sum(share * completed for share, completed in counted) / total if total else None


def median_goodput_share(runs: Sequence[dict[str, Any]], capacity: float) -> float | None:
    """``goodput_share`` of the median pair."""
    shares = [goodput_share(r, capacity) for r in runs]
    return statistics.median(shares) if shares else None


def _at_least(bound: float) -> Callable[[float], bool]:
    return lambda value: value >= bound


def _at_most(bound: float) -> Callable[[float], bool]:
    return lambda value: value <= bound


def _judged(
    name: str,
    target: str,
    values: Sequence[tuple[float, float | None]],
    ok: Callable[[float], bool],
    digits: int = 2,
) -> Figure:
    """Met when every point was measured and every value is within its bound."""
    measured = [value for _, value in values if value is not None]
    met = bool(measured) and len(measured) == len(values) and all(ok(v) for v in measured)
    return Figure(name, target, tuple(values), met, digits)


def _count(name: str, target: str, values: Sequence[tuple[float, float | None]]) -> Figure:
    return _judged(name, target, values, _at_most(0.0), digits=0)


def _refused(
    results: dict[str, Any], side: str, loads: Sequence[float]
) -> list[tuple[float, float | None]]:
    """Refusals (503/429) summed over the pairs, at each of ``loads`` the run measured."""
    return [
        (p, float(sum(r["refused"] for r in _runs(results, side, i))))
        for i, p in enumerate(results["points"])
        if p in loads
    ]


def default_figures(results: dict[str, Any], side: str) -> list[Figure]:
    """Warden's default config must be invisible: tokens/s, API CPU per request, no refusal."""
    points = results["points"]
    tokens = [
        (p, median_ratio(results, side, i, "engine_tokens_per_s")) for i, p in enumerate(points)
    ]
    api = [
        (p, median_ratio(results, side, i, "api_cpu_ms_per_request")) for i, p in enumerate(points)
    ]
    return [
        _judged(
            "default: engine tok/s w/p",
            f">= {DEFAULT_TOKENS_MIN} at every point",
            tokens,
            _at_least(DEFAULT_TOKENS_MIN),
        ),
        _judged(
            "default: API-server CPU/request w/p",
            f"<= {DEFAULT_API_CPU_MAX} at every point",
            api,
            _at_most(DEFAULT_API_CPU_MAX),
        ),
        _count("default: refused", "0 at 0.5x and 1x", _refused(results, side, DEFAULT_NO_REFUSAL)),
    ]


def slo_figures(results: dict[str, Any], side: str) -> list[Figure]:
    """Warden with the SLO set: at the overloads, what it admits keeps the SLO, and the engine
    stays as busy as plain's; nothing refused at half load."""
    points, capacity = results["points"], results["capacity_per_s"]
    overloads = [(i, p) for i, p in enumerate(points) if p >= OVERLOAD_FROM]
    within = [(p, pooled_within_share(_runs(results, side, i))) for i, p in overloads]
    tokens = [(p, median_ratio(results, side, i, "engine_tokens_per_s")) for i, p in overloads]
    goodput = [(p, median_goodput_share(_runs(results, side, i), capacity)) for i, p in overloads]
    return [
        _judged(
            "SLO: admitted requests within the SLO, all pairs",
            f">= {SLO_WITHIN_MIN} at 2x-4x",
            within,
            _at_least(SLO_WITHIN_MIN),
            digits=3,
        ),
        _judged(
            "SLO: engine tok/s w/p",
            f">= {SLO_TOKENS_MIN} at 2x-4x",
            tokens,
            _at_least(SLO_TOKENS_MIN),
        ),
        _judged(
            "SLO: goodput / capacity, median pair",
            f">= {SLO_GOODPUT_MIN} at 2x-4x",
            goodput,
            _at_least(SLO_GOODPUT_MIN),
        ),
        _count("SLO: refused", "0 at 0.5x", _refused(results, side, SLO_NO_REFUSAL)),
    ]


def honouring_figures(results: dict[str, Any], side: str) -> list[Figure]:
    """Clients that honour Retry-After: every refusal carries one, and the returns it asks
    for are admitted. The issue gives no share for the first returns: printed, not judged."""
    honoured = [
        (p, [r["honouring"] for r in _runs(results, side, i)])
        for i, p in enumerate(results["honour_points"])
    ]
    first = []
    for point, runs in honoured:
        returned = sum(h["returned"] for h in runs)
        admitted = sum(h["admitted_on_first_return"] for h in runs)
        first.append((point, admitted / returned if returned else None))
    return [
        _count(
            "honouring clients: refused without Retry-After",
            "0",
            [(p, float(sum(h["no_retry_after"] for h in runs))) for p, runs in honoured],
        ),
        _count(
            "honouring clients: gave up",
            "0",
            [(p, float(sum(h["gave_up"] for h in runs))) for p, runs in honoured],
        ),
        Figure(
            "honouring clients: admitted on their first return",
            "admitted on their return (no share given)",
            tuple(first),
            None,
            digits=3,
        ),
    ]


def lost_figure(
    results: dict[str, Any], sides: Sequence[str], honouring_side: str | None
) -> Figure:
    """Requests warden lost (failed and not refused), summed over its sides and pairs."""
    at = {side: results["points"] for side in sides}
    if honouring_side is not None:
        at[honouring_side] = results["honour_points"]
    values = []
    for point in sorted({point for points in at.values() for point in points}):
        lost = sum(
            r["lost"]
            for side, points in at.items()
            if point in points
            for r in _runs(results, side, points.index(point))
        )
        values.append((point, float(lost)))
    return _count("lost, warden (every config)", "0 at every point", values)


def figures(
    results: dict[str, Any], warden_sides: Mapping[str, str], honouring_side: str
) -> list[Figure]:
    """The issue's figures for the configurations this run measured: ``warden_sides`` names
    each configuration's side in the results, ``honouring_side`` the honouring clients' one."""
    configs = results["configs"]
    honouring = honouring_side if "slo" in configs and results.get("honour_points") else None
    out: list[Figure] = []
    if "default" in configs:
        out += default_figures(results, warden_sides["default"])
    if "slo" in configs:
        out += slo_figures(results, warden_sides["slo"])
    if honouring is not None:
        out += honouring_figures(results, honouring)
    out.append(lost_figure(results, [warden_sides[name] for name in configs], honouring))
    return out


def figures_text(
    results: dict[str, Any], warden_sides: Mapping[str, str], honouring_side: str
) -> str:
    """The figures as a table, with how many of those with a bound are met."""
    found = figures(results, warden_sides, honouring_side)
    rows = [
        f"| {f.name} | {f.target} | {f.value_text()} | "
        f"{'-' if f.met is None else 'yes' if f.met else 'no'} |"
        for f in found
    ]
    judged = [f for f in found if f.met is not None]
    met = sum(1 for f in judged if f.met)
    return "\n".join(
        [
            f"issue #28's figures: {met} of {len(judged)} met",
            "| figure | target | value at each point | met |",
            "|---|---|---|---|",
            *rows,
        ]
    )
