"""The overload benchmark's CPU timeline: what the engine's processes and cores did while
admitted requests ran late, against while the rest ran (benchmarks/cpu_timeline.py, #28)."""

from __future__ import annotations

import os
import time

from benchmarks.cpu_timeline import CpuTimeline, cpu_text, cpu_while_running, machine_cpu_s
from benchmarks.overload import report


def _timeline(reads: list[tuple[float, dict[str, float]]]) -> CpuTimeline:
    timeline = CpuTimeline(dict)
    timeline.samples = list(reads)
    return timeline


# A worker at a full core for 0-4 s, then starved to 0.2 of one for 4-6 s while the API
# server took 0.8; then full again. Reads every second.
READS = [
    (float(t), {"worker": w, "api": a, "steal": 0.0, "idle": 0.0})
    for t, w, a in [
        (0, 0.0, 0.0),
        (1, 1.0, 0.0),
        (2, 2.0, 0.0),
        (3, 3.0, 0.0),
        (4, 4.0, 0.0),
        (5, 4.2, 0.8),
        (6, 4.4, 1.6),
        (7, 5.4, 1.6),
        (8, 6.4, 1.6),
    ]
]


def test_a_share_is_the_cpu_between_the_reads_around_the_span_per_second() -> None:
    timeline = _timeline(READS)
    shares = timeline.shares(4.0, 6.0)
    assert {key: round(value, 6) for key, value in shares.items()} == {
        "worker": 0.2,
        "api": 0.8,
        "steal": 0.0,
        "idle": 0.0,
    }
    # Between reads, the span widens to the reads around it: 4.5-5.5 is read as 4-6.
    assert round(timeline.shares(4.5, 5.5)["worker"], 6) == 0.2
    assert round(timeline.shares(0.5, 2.5)["worker"], 6) == 1.0
    # Reads that do not cover the span give nothing rather than a guess.
    assert timeline.shares(8.5, 9.0) == {}


def test_late_requests_are_told_apart_by_the_cpu_they_ran_with() -> None:
    """Two requests on time while the worker had its core, two late through its starved
    seconds: each group's median share, the count, and the longest wake-up lag."""
    timeline = _timeline(READS)
    timeline.lags = [(5.0, 0.4), (1.0, 0.05)]
    groups = cpu_while_running([(0.0, 1.0), (1.0, 1.0), (4.0, 2.0), (4.5, 1.5)], 1.2, timeline)
    assert groups["on_time"] == {
        "requests": 2.0,
        "worker": 1.0,
        "api": 0.0,
        "steal": 0.0,
        "idle": 0.0,
        "lag_max_s": 0.05,
    }
    assert groups["late"] == {
        "requests": 2.0,
        "worker": 0.2,
        "api": 0.8,
        "steal": 0.0,
        "idle": 0.0,
        "lag_max_s": 0.4,
    }
    assert cpu_text(groups) == (
        "late 2: worker 0.20, api 0.80, steal 0.00, idle 0.00, lag 0.40 s; "
        "on time 2: worker 1.00, api 0.00, steal 0.00, idle 0.00, lag 0.05 s"
    )


def test_the_report_names_each_pair_and_point_with_late_requests_and_its_cpu() -> None:
    late = {"late": {"requests": 3.0, "worker": 0.4, "api": 0.5}, "on_time": {"requests": 9.0}}
    on_time = {"on_time": {"requests": 12.0, "worker": 0.9}}
    spent = {
        "late": {
            "requests": 3.0,
            "first_token_s": 0.9,
            "decode_s": 0.7,
            "tokens": 120.0,
            "ahead_tokens": 1.1,
        }
    }
    points = []
    for groups, times in ((on_time, {}), (late, spent)):
        points.append(
            {
                "rate": 12.0,
                "completed": 10,
                "failed": 0,
                "refused": 0,
                "lost": 0,
                "engine_tokens_per_s": 100.0,
                "goodput_per_s": 6.0,
                "within_slo_share": 1.0,
                "api_cpu_ms_per_request": 10.0,
                "core_cpu_ms_per_request": 10.0,
                "cpu_while_running": groups,
                "late_time": times,
            }
        )
    results = {
        "capacity_per_s": 6.0,
        "slo_s": 1.0,
        "configs": ["slo"],
        "points": [2.0, 4.0],
        "honour_points": [],
        "pairs": [{"plain": points, "warden_slo": points}],
    }
    text = report(results)
    assert text.endswith(
        "where the admitted requests' time went, late and on time (median per request):\n"
        "- 4x pair 1: late 3: first token 0.90 s, decode 0.70 s, 120 tokens, 1.10x the tokens"
        " ahead\n\n"
        "CPU while admitted requests ran late and on time (median per request, cores):\n"
        "- 4x pair 1: late 3: worker 0.40, api 0.50, lag 0.00 s; on time 9: lag 0.00 s"
    )
    assert "2x pair 1" not in text


def test_a_running_timeline_reads_this_process_and_the_cores_it_names() -> None:
    """On the real machine: a timeline over a busy loop of this process reads its CPU rising,
    and the machine's idle and steal of the cores given."""
    me = os.getpid()
    cores = frozenset(os.sched_getaffinity(me))

    def own() -> dict[str, float]:
        times = os.times()
        return {"worker": times.user + times.system}

    timeline = CpuTimeline(own, cores, every_s=0.02)
    with timeline:
        began = time.perf_counter()
        # Busy for 0.3 s at least, and until the sampler has read while it ran: on a loaded
        # host its thread may not be scheduled within a fixed 0.3 s (it read once in 0.39 s).
        while time.perf_counter() - began < 0.3 or (
            len(timeline.samples) < 3 and time.perf_counter() - began < 60
        ):
            pass
    assert len(timeline.samples) >= 4  # the first read, at least two while running, the last
    assert set(timeline.samples[0][1]) == {"worker", "steal", "idle"}
    assert timeline.shares(began, began + 0.3)["worker"] > 0.0
    assert set(machine_cpu_s(cores)) == {"steal", "idle"}
