"""The overload benchmark's figures while the load is offered (issue #28).

Engine tokens/s and goodput are read over the window from the first request sent to the last:
after it plain vLLM drains its backlog at a full batch while warden, having refused, has little
left, so a rate over the whole run would compare different loads. The counting is checked here
on results whose answers are known.
"""

from __future__ import annotations

from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from benchmarks.overload import (
    CpuSplit,
    DeepAdmissionLog,
    Window,
    completed_per_s,
    cpu_split,
    decoding_batch,
    goodput_in,
    late_time,
    late_time_text,
    offered_window,
    pooled_within_share,
    refusal_causes,
    report,
    side_order,
    slo_from,
    value_at,
    within_slo_share,
)
from exporter.saturation import PACE_MIN_CHANGES
from tests.support.asgi import serving

# Five requests sent at 0..4 s (the window is 4 s long): a refused one (error), one answered
# late (3 s, over a 2 s SLO), one answered in time but after the window's end, two in time.
RESULT = {
    "start_times": [100.0, 101.0, 102.0, 103.0, 104.0],
    "latencies": [1.0, 0.0, 3.0, 1.5, 0.5],
    "errors": ["", "Service Unavailable", "", "", ""],
    "request_throughput": 99.0,
}


def test_the_window_runs_from_the_first_request_sent_to_the_last() -> None:
    window = offered_window(RESULT)
    assert window == Window(100.0, 104.0) and window.length == 4.0
    assert offered_window({"start_times": [5.0]}) is None
    assert offered_window({}) is None


def test_goodput_counts_answers_in_time_and_within_the_window() -> None:
    window = Window(100.0, 104.0)
    # In time and done by 104: the first (101.0) only; the fourth ends at 104.5, the fifth at
    # 104.5, the third is late, the second was refused.
    assert goodput_in(RESULT, window, slo_s=2.0) == pytest.approx(1 / 4)
    assert goodput_in(RESULT, Window(100.0, 105.0), slo_s=2.0) == pytest.approx(3 / 5)


def test_the_decoding_batch_counts_each_answer_from_its_first_token_to_its_last_in_the_window() -> (
    None
):
    result = {**RESULT, "ttfts": [0.5, None, 1.0, 0.5, 0.25]}
    # Decoding: 100.5-101.0, 103.0-105.0 (to 104.0 in the window), 103.5-104.5 (to 104.0),
    # 104.25-104.5 (after the window); the refused one never decoded.
    assert decoding_batch(result, Window(100.0, 104.0)) == pytest.approx((0.5 + 1.0 + 0.5) / 4)
    assert decoding_batch(result, Window(103.0, 103.0)) is None
    assert decoding_batch({"start_times": [1.0], "latencies": [1.0]}, Window(0, 4)) == 0.0


def test_the_share_within_the_slo_is_over_the_answered_requests_of_the_whole_run() -> None:
    assert within_slo_share(RESULT, slo_s=2.0) == pytest.approx(3 / 4)
    refused = {"start_times": [1.0], "latencies": [0.0], "errors": ["x"]}
    assert within_slo_share(refused, 2.0) is None


def test_the_pooled_share_counts_every_admitted_request_of_the_pairs_once() -> None:
    """Pairs of 300 and 150 answered requests, 0 and 4 late: 4 of 450 missed, whatever the
    share of the smaller pair alone (0.973); a pair that admitted nothing adds nothing."""
    runs = [
        {"within_slo_share": 1.0, "completed": 300},
        {"within_slo_share": 146 / 150, "completed": 150},
        {"within_slo_share": None, "completed": 0},
    ]
    assert pooled_within_share(runs) == pytest.approx(446 / 450)
    assert pooled_within_share([{"within_slo_share": None, "completed": 0}]) is None


def test_capacity_is_completions_per_second_of_the_window() -> None:
    # Answered by 104: only the first (the others end at 104.5, 104.5 and 105).
    assert completed_per_s(RESULT) == pytest.approx(1 / 4)
    assert completed_per_s({"request_throughput": 7.5}) == 7.5


def test_a_counter_between_two_reads_is_read_on_the_line_between_them() -> None:
    samples = [(10.0, 100.0), (12.0, 300.0), (14.0, 300.0)]
    assert value_at(samples, 11.0) == pytest.approx(200.0)
    assert value_at(samples, 13.0) == pytest.approx(300.0)
    assert value_at(samples, 5.0) == 100.0 and value_at(samples, 20.0) == 300.0


def test_the_client_gets_a_core_of_its_own_and_the_engine_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert cpu_split("auto") == CpuSplit(frozenset({0, 1, 2}), frozenset({3}))
    assert cpu_split("2,3") == CpuSplit(frozenset({0, 1}), frozenset({2, 3}))
    assert cpu_split("none") is None
    split = cpu_split("auto")
    assert split is not None and split.engine_env() == {"VLLM_CPU_OMP_THREADS_BIND": "0,1,2"}
    with pytest.raises(ValueError, match="core numbers"):
        cpu_split("last")
    with pytest.raises(ValueError, match="leaves no core"):
        cpu_split("0,1,2,3")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert cpu_split("auto") is None


def _point(goodput: float, capacity: float) -> dict[str, float | int | None]:
    return {
        "engine_tokens_per_s": 100.0,
        "goodput_per_s": goodput,
        "api_cpu_ms_per_request": 10.0,
        "core_cpu_ms_per_request": 5.0,
        "within_slo_share": 1.0,
        "server_within_slo_share": 1.0,
        "refused": 0,
        "lost": 0,
        "client_late_s": 0.0,
        "capacity_per_s": capacity,
    }


def test_goodput_is_a_share_of_the_capacity_measured_right_before_its_point() -> None:
    """The machine slowed from 10 to 6 requests/s after the start: the point run at 6 is
    judged against 6, not against the start's 10 (which would read 0.50 for 0.83)."""
    results = {
        "capacity_per_s": 10.0,
        "slo_s": 2.0,
        "configs": ["slo"],
        "points": [2.0],
        "honour_points": [],
        "pairs": [{"plain": [_point(0.5, 6.0)], "warden_slo": [_point(5.0, 6.0)]}],
    }
    text = report(results)
    assert "capacity re-measured before each point: 6.00-6.00 requests/s" in text
    row = next(line for line in text.splitlines() if line.startswith("| 2x"))
    assert "| 0.83 |" in row and "| 0.50 |" not in row


def test_the_worker_cpu_per_token_shows_a_machine_that_changed_speed_within_a_pair() -> None:
    """The same model work cost warden's worker 1.2x plain's: the report says so beside the
    tokens/s it puts in doubt; a run measured before the column existed reads "-"."""
    plain, warden = _point(0.5, 6.0), _point(5.0, 6.0)
    plain["worker_cpu_ms_per_token"], warden["worker_cpu_ms_per_token"] = 1.0, 1.2
    results = {
        "capacity_per_s": 6.0,
        "slo_s": 2.0,
        "configs": ["slo"],
        "points": [2.0, 3.0],
        "honour_points": [],
        "pairs": [{"plain": [plain, _point(0.5, 6.0)], "warden_slo": [warden, _point(5.0, 6.0)]}],
    }
    text = report(results)
    assert "| worker CPU/token w/p |" in text
    rows = [line for line in text.splitlines() if line.startswith(("| 2x", "| 3x"))]
    worker = [row.split("|")[6].strip() for row in rows]  # load, then the ratios' columns
    assert worker == ["1.20 (1.20-1.20)", "-"]


def test_refusals_are_counted_by_signal_from_the_state_kept_since_the_run_began() -> None:
    """``/warden/state`` keeps its last 64 refusals: those of the run (at or after its start)
    are counted by signal with the range of the values they named; earlier ones are not."""
    state = {
        "recent_rejections": [
            {"at": 99.0, "reason": "saturated", "signal": "latency_s", "value": 9.0},
            {"at": 100.0, "reason": "saturated", "signal": "latency_s", "value": 1.07},
            {
                "at": 101.5,
                "reason": "saturated",
                "signal": "latency_s",
                "value": 1.02,
                "basis": {"wait_s": 0.4, "service_s": 0.62},
            },
            {"at": 102.0, "reason": "saturated", "signal": "queue_depth", "value": 4},
            {"at": 103.0, "reason": "reject_all", "signal": None, "value": None},
        ]
    }
    assert refusal_causes(state, 100.0) == {
        "latency_s": {
            "count": 2,
            "min": 1.02,
            "max": 1.07,
            "bases": [{"wait_s": 0.4, "service_s": 0.62}],
        },
        "queue_depth": {"count": 1, "min": 4, "max": 4},
        "reject_all": {"count": 1, "min": None, "max": None},
    }
    assert refusal_causes({}, 100.0) == {}


def test_refusals_at_a_light_load_are_named_under_the_table() -> None:
    """Any refusal at 0.5x or 1x is one too many (issue #28): the report says which signal
    refused and how far its forecast was, over the pairs; none at 2x is listed."""
    light, heavy = _point(0.5, 6.0), _point(5.0, 6.0)
    light["refused"], heavy["refused"] = 3, 40
    light["refusal_causes"] = {
        "latency_s": {
            "count": 3,
            "min": 1.01,
            "max": 1.12,
            "bases": [
                {
                    "wait_s": 0.41,
                    "service_s": 0.6,
                    "measured_service_s": 0.31,
                    "running": 5,
                    "waiting": 3,
                    "capacity": 8,
                },
                {"wait_s": 0.5, "service_s": 0.62, "slot": 2, "running": 8, "waiting": 2},
                {
                    "wait_s": 0.0,
                    "service_s": 1.57,
                    "measured_service_s": 1.02,
                    "scaled_service_s": 1.05,
                    "serving_batch": 8,
                    "slowdown": 1.54,
                    "output_tokens": 141,
                    "running": 4,
                    "waiting": 0,
                    "capacity": 8,
                },
            ],
        }
    }
    heavy["refusal_causes"] = {"latency_s": {"count": 40, "min": 1.5, "max": 9.0}}
    results = {
        "capacity_per_s": 6.0,
        "slo_s": 1.0,
        "configs": ["slo"],
        "points": [0.5, 2.0],
        "honour_points": [],
        "pairs": [{"plain": [_point(0.5, 6.0)] * 2, "warden_slo": [light, heavy]}],
    }
    text = report(results)
    assert "refused at 0.5x, by signal (values named): latency_s x3 (1.01-1.12)" in text
    # Each refusal kept with its basis is spelled out under it, with its pair.
    assert (
        "\n- pair 1: wait 0.41 + service 0.60 s (measured 0.31), slot -, 5 running / 3 waiting"
        " of 8"
        "\n- pair 1: wait 0.50 + service 0.62 s, slot 2, 8 running / 2 waiting"
        "\n- pair 1: wait 0.00 + service 1.57 s for 141 tokens (scaled 1.05, measured 1.02,"
        " at a batch of 8, steps x1.54), slot -, 4 running / 0 waiting of 8\n"
    ) in text
    assert "refused at 2x" not in text


def test_each_overload_pair_short_of_the_goodput_target_is_named_with_its_worker_ratio() -> None:
    """Under 0.9 of capacity at 2x: the pair is named with how much more CPU per token the
    same model work cost warden's worker (a slower machine on that side); 0.5x is not an
    overload and a pair at the target is not named."""
    light, plain, warden = _point(2.0, 6.0), _point(0.5, 6.0), _point(4.5, 6.0)
    plain["worker_cpu_ms_per_token"], warden["worker_cpu_ms_per_token"] = 1.0, 1.3
    text = report(_slo_run([0.5, 2.0, 3.0], [plain] * 3, [light, warden, _point(5.4, 6.0)]))
    assert text.endswith(
        "goodput under 0.9 of capacity at 2x and up: 2x pair 1: 0.75, worker CPU/token w/p 1.30"
    )


@pytest.mark.parametrize(
    ("measured", "label", "column", "crowded"),
    [
        # Tokens/s at 0.8x plain's: equal worker speed multiplies by the worker's ratio.
        (("engine_tokens_per_s", 80.0), "engine tok/s at equal worker speed", 7, "0.80"),
        # API CPU per request at 1.25x plain's: equal worker speed divides by it.
        (("api_cpu_ms_per_request", 12.5), "API CPU/req at equal worker speed", 8, "1.25"),
    ],
)
def test_ratios_at_equal_worker_speed_leave_out_a_slower_machine_only(
    measured: tuple[str, float], label: str, column: int, crowded: str
) -> None:
    """Warden's side ran with its worker at 1.25x plain's CPU per token: the machine made the
    same model work dearer there, and made fewer tokens per second (0.8x) or dearer API work
    (1.25x) of it; at equal worker speed either ratio is 1.00. A pair whose worker kept
    plain's speed while the same happened (its core taken by something else, warden's API
    server among it; or warden's own API cost) keeps its ratio."""
    field, value = measured
    plain = _point(0.5, 6.0)
    slowed, crowding = _point(4.5, 6.0), _point(4.5, 6.0)
    plain["worker_cpu_ms_per_token"] = 1.0
    slowed[field], slowed["worker_cpu_ms_per_token"] = value, 1.25
    crowding[field], crowding["worker_cpu_ms_per_token"] = value, 1.0
    text = report(_slo_run([2.0, 3.0, 4.0], [plain] * 3, [slowed, crowding, _point(4.5, 6.0)]))
    assert f"| {label} w/p |" in text
    rows = [line for line in text.splitlines() if line.startswith(("| 2x", "| 3x", "| 4x"))]
    equal_speed = [row.split("|")[column].strip() for row in rows]
    assert equal_speed == ["1.00 (1.00-1.00)", f"{crowded} ({crowded}-{crowded})", "-"]


def _slo_run(points: list[float], plain: list[Any], warden: list[Any]) -> dict[str, Any]:
    """One pair's results, the SLO config only, at a capacity of 6 requests/s and an SLO of 1 s."""
    return {
        "capacity_per_s": 6.0,
        "slo_s": 1.0,
        "configs": ["slo"],
        "points": points,
        "honour_points": [],
        "pairs": [{"plain": plain, "warden_slo": warden}],
    }


def test_the_slo_is_twice_the_slower_half_load_p99() -> None:
    """Measured once at a fast moment the SLO was one plain vLLM itself missed at 0.5x minutes
    later (run 19): the slower of the measurements sets it."""
    assert slo_from([0.66, 0.95], 2.0) == pytest.approx(1.9)
    assert slo_from([0.95, 0.66], 2.0) == pytest.approx(1.9)
    assert slo_from([0.8], 1.5) == pytest.approx(1.2)


def test_every_side_runs_once_in_every_place_at_every_point_over_as_many_pairs() -> None:
    """Reversing the order kept the middle of three sides in the middle at every point of
    every pair (runs 8-25): warden's default config never ran first, and its ratios could not
    tell its own cost from its place. Rotated, each side holds each place once per point."""
    sides = ["plain", "warden", "warden_slo"]
    for index in range(5):
        orders = [side_order(sides, pair, index) for pair in range(len(sides))]
        for order in orders:
            assert sorted(order) == sorted(sides)
        for place in range(len(sides)):
            assert sorted(order[place] for order in orders) == sorted(sides)
    # From point to point within a pair the order moves too.
    assert side_order(sides, 0, 0) != side_order(sides, 0, 1)
    assert side_order(["plain", "warden"], 1, 0) == ["warden", "plain"]


def test_a_late_requests_time_is_split_into_first_token_and_decode_with_the_tokens_ahead() -> None:
    """Run 49: the late ones waited for their first token (the queue), not decoding slower,
    and long requests had gone in ahead of them. Two requests within a 1.5 s SLO sent 0.1 s
    apart with 50 tokens each; a refused one (no tokens); two late ones sent 1 s later with
    150 tokens each, 1.2 s to the first token."""
    result = {
        "start_times": [10.0, 10.1, 10.5, 11.0, 11.1],
        "latencies": [0.8, 0.9, 0.0, 2.0, 2.2],
        "ttfts": [0.3, 0.3, None, 1.2, 1.2],
        "output_lens": [50, 50, 0, 150, 150],
        "errors": ["", "", "Service Unavailable", "", ""],
    }
    groups = late_time(result, 1.5)
    # The point's mean is 100 tokens. Ahead of the first late one (sent at 11.0): the two
    # short ones (50, 0.5x); of the second: those and the first late one (83.3, 0.833x).
    assert groups["late"] == {
        "first_token_s": 1.2,
        "decode_s": 0.9,
        "tokens": 150.0,
        "ahead_tokens": 0.667,
        "requests": 2.0,
    }
    # Nothing was admitted before the first; the second had the first (0.5x).
    assert groups["on_time"] == {
        "first_token_s": 0.3,
        "decode_s": 0.55,
        "tokens": 50.0,
        "ahead_tokens": 0.75,
        "requests": 2.0,
    }
    assert late_time_text(groups) == (
        "late 2: first token 1.20 s, decode 0.90 s, 150 tokens, 0.67x the tokens ahead; "
        "on time 2: first token 0.30 s, decode 0.55 s, 50 tokens, 0.75x the tokens ahead"
    )
    assert late_time({"start_times": [], "latencies": []}, 1.5) == {}


def _deep(ended_s_ago: float, latency_s: float, margin: float = 1.0) -> dict[str, Any]:
    return {
        "ended_s_ago": ended_s_ago,
        "slot": 6,
        "forecast_s": round(latency_s * 0.9, 3),
        "deep_factor": 1.0,
        "pace_margin": margin,
        "allowed_s": 0.9,
        "latency_s": latency_s,
    }


def _state_app(recent: list[dict[str, Any]]) -> Starlette:
    """A real HTTP app whose ``/warden/state`` lists the deep admissions in ``recent`` now."""

    async def state(_request: Request) -> JSONResponse:
        limits = {"latency_slo_s": 1.0}
        measured = {"pace_margin": 1.05, "pace_changes": 9}
        saturation = {"limits": limits, "measured": measured, "deep_slots": {"recent": recent}}
        return JSONResponse({"saturation": saturation})

    return Starlette(routes=[Route("/warden/state", state)])


def test_deep_admissions_read_every_second_are_each_kept_once_and_the_late_ones_named() -> None:
    """``/warden/state`` keeps only the last deep admissions: read again a second later, an
    admission still listed is the same one (kept once), a new one is added, and the report
    names the late ones (over the 1 s SLO) with the pace margin they were judged with."""
    recent: list[dict[str, Any]] = []
    # The reads' clock, moved by the test: on a loaded machine a read's HTTP round trip took
    # seconds, and the ends it worked out from wall time no longer matched (1 failure).
    clock = [1000.0]
    with serving(_state_app(recent)) as url:
        log = DeepAdmissionLog(url, clock=lambda: clock[0])
        clock[0] += 0.3
        # The first read still lists one that ended before the log began: not this phase's.
        recent[:] = [_deep(0.2, 0.5), _deep(0.1, 1.2, margin=1.05), _deep(5.0, 0.7)]
        log.read()
        clock[0] += 0.3
        recent[:] = [_deep(0.0, 0.6), _deep(0.5, 0.5), _deep(0.4, 1.2, margin=1.05)]
        log.read()
    seen = log.admissions()
    assert [entry["latency_s"] for entry in seen] == [0.5, 1.2, 0.6]
    assert log.reads == 2
    run = {**_point(5.0, 6.0), "completed": 40, "deep_admissions": {"began_at": 0.0, "seen": seen}}
    text = report(_slo_run([2.0], [_point(5.0, 6.0)], [run]))
    line = text.split("read every second:\n")[1]
    assert line.startswith("- 2x pair 1: 3 seen of 40 completed, late 1: admitted ")
    assert "pace margin 1.05, factor 1.00, allowed 0.90 of the SLO, took 1.33x that" in line
    assert not log.in_flight  # the state named no in-flight counts
    assert [(margin, changes) for _t, margin, changes in log.pace] == [(1.05, 9)] * 2
    unmeasured = (1.0, 1.0, PACE_MIN_CHANGES - 1)  # too few changes: the margin reads 1.0
    paced = {**run["deep_admissions"], "pace": [unmeasured, (2.0, 1.05, 9), (3.0, 1.2, 12)]}
    text = report(_slo_run([2.0], [_point(5.0, 6.0)], [{**run, "deep_admissions": paced}]))
    assert text.endswith("pace margin measured at 2 of 3 reads (1.05-1.20)")
    counted = {**run["deep_admissions"], "in_flight": [(1.0, 30, 10, 8, 2), (2.0, 12, 12, 8, 4)]}
    text = report(_slo_run([2.0], [_point(5.0, 6.0)], [{**run, "deep_admissions": counted}]))
    assert text.endswith(
        "admitted in flight over the engine's unfinished, per read: median 10, max 20"
    )
    # One pair without a late deep admission is not listed.
    on_time = {**run, "deep_admissions": {"began_at": 0.0, "seen": seen[:1]}}
    assert "read every second" not in report(_slo_run([2.0], [_point(5.0, 6.0)], [on_time]))


def test_the_first_returns_are_counted_by_when_they_came_over_the_pairs() -> None:
    """Under the honouring table: each bin of the run, the first returns refused again over
    the first returns, summed over the pairs; bins without a return are left out."""
    honouring = {
        "refused_requests": 0,
        "returned": 0,
        "admitted_on_first_return": 0,
        "gave_up": 0,
        "no_retry_after": 0,
        "median_retry_after_s": None,
    }
    runs = [
        {"honouring": {**honouring, "first_returns_by_time": bins}, "within_slo_share": 1.0}
        for bins in ([[10, 1], [0, 0], [5, 5]], [[4, 0]])
    ]
    for run in runs:
        run.update(lost=0, engine_tokens_per_s_run=1.0)
    plain = {**_point(5.0, 6.0), "engine_tokens_per_s_run": 1.0}
    results = {**_slo_run([4.0], [plain], [_point(5.0, 6.0)]), "honour_points": [4.0]}
    results["pairs"] = [{**results["pairs"][0], "warden_slo_honouring": [runs[0]]}]
    results["pairs"].append({**results["pairs"][0], "warden_slo_honouring": [runs[1]]})
    text = report(results)
    assert text.endswith(
        "first returns refused again / first returns, by when they came (s into the run):"
        "\n- 4x: 0-10 s: 1/14, 20-30 s: 5/5"
    )
