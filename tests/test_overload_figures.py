"""Issue #28's figures, judged by the overload benchmark itself (benchmarks/overload_figures.py).

Each run was judged by hand from its tables; the report now says which figure is met, on the
same readings the tables use (the median pair of a ratio, the pooled share of the pairs'
admitted requests, counts summed over the pairs). Checked on results whose answers are known.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.overload import CONTROL, HONOURING_ENGINE, WARDEN_SIDES, main, report
from benchmarks.overload_figures import Figure, figures, figures_text

POINTS = [0.5, 1.0, 2.0, 3.0, 4.0]
HONOUR_POINTS = [2.0, 4.0]


def _run(tokens: float = 100.0, api_ms: float = 10.0, goodput: float = 5.4) -> dict[str, Any]:
    return {
        "engine_tokens_per_s": tokens,
        "goodput_per_s": goodput,
        "api_cpu_ms_per_request": api_ms,
        "core_cpu_ms_per_request": 5.0,
        "within_slo_share": 1.0,
        "server_within_slo_share": 1.0,
        "completed": 100,
        "refused": 0,
        "lost": 0,
        "client_late_s": 0.0,
        "capacity_per_s": 6.0,
    }


def _honouring() -> dict[str, Any]:
    run = _run()
    run["engine_tokens_per_s_run"] = 100.0
    run["honouring"] = {
        "refused_requests": 50,
        "returned": 50,
        "admitted_on_first_return": 48,
        "gave_up": 0,
        "no_retry_after": 0,
        "median_retry_after_s": 3.0,
    }
    return run


def _results(pairs: int = 3) -> dict[str, Any]:
    """A run that meets every figure: warden as plain, the SLO kept, nothing refused at
    0.5x (or at 1x on the default config), nothing lost."""
    one = {
        "plain": [_run() for _ in POINTS],
        "warden": [_run() for _ in POINTS],
        "warden_slo": [_run() for _ in POINTS],
        HONOURING_ENGINE: [_honouring() for _ in HONOUR_POINTS],
    }
    for point, plain in zip(POINTS, one["plain"], strict=True):
        plain["engine_tokens_per_s_run"] = 100.0
        plain["rate"] = point * 6.0
    return {
        "capacity_per_s": 6.0,
        "slo_s": 1.0,
        "configs": ["default", "slo"],
        "points": POINTS,
        "honour_points": HONOUR_POINTS,
        "pairs": [copy.deepcopy(one) for _ in range(pairs)],
    }


def _figure(results: dict[str, Any], name: str) -> Figure:
    return next(f for f in figures(results, WARDEN_SIDES, HONOURING_ENGINE) if f.name == name)


def test_a_run_that_meets_every_bound_says_so_and_leaves_the_unnumbered_figure_unjudged() -> None:
    text = figures_text(_results(), WARDEN_SIDES, HONOURING_ENGINE)
    assert text.startswith("issue #28's figures: 10 of 10 met\n")
    assert "| no |" not in text
    # The first-return share has no bound in the issue: printed, not judged.
    assert (
        "| honouring clients: admitted on their first return | admitted on their return"
        " (no share given) | 2x 0.960 / 4x 0.960 | - |"
    ) in text


def test_a_ratio_is_judged_on_its_median_pair_not_on_its_worst() -> None:
    results = _results()
    # 3x: warden's engine made 0.90x plain's tokens in one pair, 0.96x in another.
    results["pairs"][0]["warden"][3]["engine_tokens_per_s"] = 90.0
    assert _figure(results, "default: engine tok/s w/p").met is True
    results["pairs"][1]["warden"][3]["engine_tokens_per_s"] = 96.0
    tokens = _figure(results, "default: engine tok/s w/p")
    assert tokens.met is False
    assert tokens.value_text() == "0.5x 1.00 / 1x 1.00 / 2x 1.00 / 3x 0.96 / 4x 1.00"


def test_api_cpu_per_request_is_bounded_from_above() -> None:
    results = _results()
    for sides in results["pairs"]:
        sides["warden"][0]["api_cpu_ms_per_request"] = 10.5  # 1.05x: at the bound
    assert _figure(results, "default: API-server CPU/request w/p").met is True
    for sides in results["pairs"]:
        sides["warden"][0]["api_cpu_ms_per_request"] = 10.6
    assert _figure(results, "default: API-server CPU/request w/p").met is False


@pytest.mark.parametrize(
    ("side", "index", "figure", "met"),
    [
        ("warden", 1, "default: refused", False),  # 1x on the default config
        ("warden", 2, "default: refused", True),  # 2x: an overload, refusals allowed
        ("warden_slo", 0, "SLO: refused", False),  # 0.5x with the SLO
        ("warden_slo", 1, "SLO: refused", True),  # 1x with the SLO: the issue names 0.5x only
    ],
)
def test_refusals_count_only_at_the_loads_the_issue_names(
    side: str, index: int, figure: str, met: bool
) -> None:
    results = _results()
    results["pairs"][2][side][index]["refused"] = 1
    assert _figure(results, figure).met is met


def test_the_slo_figures_are_judged_at_the_overloads_only() -> None:
    results = _results()
    # 1x: goodput far under capacity and tokens/s under plain's; neither is an overload.
    for sides in results["pairs"]:
        sides["warden_slo"][1].update(goodput_per_s=1.0, engine_tokens_per_s=50.0)
    slo = {f.name: f for f in figures(results, WARDEN_SIDES, HONOURING_ENGINE)}
    assert slo["SLO: goodput / capacity, median pair"].met is True
    assert slo["SLO: engine tok/s w/p"].met is True
    assert [p for p, _ in slo["SLO: engine tok/s w/p"].values] == [2.0, 3.0, 4.0]
    # 4x: goodput 0.85 of the capacity measured right before the point, in two pairs of three.
    for sides in results["pairs"][:2]:
        sides["warden_slo"][4]["goodput_per_s"] = 0.85 * 6.0
    assert _figure(results, "SLO: goodput / capacity, median pair").met is False


def test_within_the_slo_is_the_share_of_every_admitted_request_of_the_pairs() -> None:
    """0.98 in a pair of 100 requests and 1.0 in two more: 298 of 300, 0.993 pooled."""
    results = _results()
    results["pairs"][0]["warden_slo"][2]["within_slo_share"] = 0.98
    within = _figure(results, "SLO: admitted requests within the SLO, all pairs")
    assert within.met is True and within.value_text().startswith("2x 0.993 /")
    # The same pair with 400 requests: 392 + 200 of 600, 0.987.
    results["pairs"][0]["warden_slo"][2]["completed"] = 400
    assert _figure(results, "SLO: admitted requests within the SLO, all pairs").met is False


def test_a_request_lost_by_any_of_wardens_engines_at_any_point_is_counted() -> None:
    results = _results()
    results["pairs"][1][HONOURING_ENGINE][1]["lost"] = 2  # 4x, the honouring clients
    results["pairs"][0]["warden"][0]["lost"] = 1  # 0.5x, the default config
    results["pairs"][0]["plain"][3]["lost"] = 9  # plain's losses are not warden's
    lost = _figure(results, "lost, warden (every config)")
    assert lost.met is False
    assert lost.value_text() == "0.5x 1 / 1x 0 / 2x 0 / 3x 0 / 4x 2"


def test_honouring_clients_refused_without_retry_after_or_giving_up_miss_their_figures() -> None:
    results = _results()
    results["pairs"][0][HONOURING_ENGINE][0]["honouring"]["no_retry_after"] = 1
    results["pairs"][2][HONOURING_ENGINE][1]["honouring"]["gave_up"] = 1
    assert _figure(results, "honouring clients: refused without Retry-After").met is False
    assert _figure(results, "honouring clients: gave up").met is False


def test_a_figure_with_a_point_that_was_not_measured_is_not_met() -> None:
    results = _results()
    for sides in results["pairs"]:
        sides["warden"][4]["api_cpu_ms_per_request"] = None
    api = _figure(results, "default: API-server CPU/request w/p")
    assert api.met is False and api.value_text().endswith("4x -")


def test_only_the_configurations_measured_are_judged() -> None:
    results = _results()
    results["configs"] = ["default"]
    names = [f.name for f in figures(results, WARDEN_SIDES, HONOURING_ENGINE)]
    assert names == [
        "default: engine tok/s w/p",
        "default: API-server CPU/request w/p",
        "default: refused",
        "lost, warden (every config)",
    ]


def test_a_saved_run_is_reported_again_with_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _results()
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(results))
    assert main(["--report", str(saved)]) == 0
    printed = capsys.readouterr().out
    assert printed == report(results) + "\n"
    assert "issue #28's figures: 10 of 10 met" in printed
    assert main(["--report", str(tmp_path / "missing.json")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("overload: cannot read ") and error.count("\n") == 1
    # JSON that is not a saved run: one line naming what it lacks, no traceback.
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"pairs": []}))
    assert main(["--report", str(other)]) == 2
    error = capsys.readouterr().err
    assert "is not a result saved with --out (no capacity_per_s, slo_s," in error
    assert error.count("\n") == 1
    other.write_text("[1, 2]")
    assert main(["--report", str(other)]) == 2
    assert "is not a result saved with --out" in capsys.readouterr().err


def test_a_second_plain_engine_is_reported_as_the_control_and_judged_on_nothing() -> None:
    """The control side's ratios to plain are what the benchmark reads where warden does
    nothing: printed in a table of their own, and no figure of the issue's is read from them."""
    results = _results()
    assert "the control" not in report(results)
    for sides in results["pairs"]:
        sides[CONTROL] = [_run(tokens=93.0, api_ms=11.0) for _ in POINTS]
    text = report(results)
    assert "issue #28's figures: 10 of 10 met" in text
    control = text[text.index("plain vLLM against a second plain vLLM") :]
    row = next(line for line in control.splitlines() if line.startswith("| 1x"))
    assert row.startswith("| 1x | 0.93 (0.93-0.93) | 1.00 (1.00-1.00) | 1.10 (1.10-1.10) |")
