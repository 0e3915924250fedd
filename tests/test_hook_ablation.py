"""The hook ablation's report (benchmarks/hook_ablation.py): ratios to plain's run of the
same round, and the API server's share of the worker's CPU, on results whose answers are
known. The engines themselves are the overload benchmark's (tests of benchmarks.overload)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.hook_ablation import main, report, rotated


def _run(
    tokens_per_s: float, api_us: float, worker_us: float, api_ms: float = 10.0
) -> dict[str, float]:
    return {
        "api_ms_per_request": api_ms,
        "tokens_per_s": tokens_per_s,
        "failed": 0,
        "api_us_per_token": api_us,
        "core_us_per_token": 80.0,
        "worker_us_per_token": worker_us,
        "api_share": api_us / worker_us,
    }


def _results() -> dict[str, Any]:
    return {
        "rate": 50.0,
        "requests": 750,
        "rounds": 2,
        "cpus": {"engine": [0], "client": [1]},
        "runs": {
            # The host ran 25% slower in round 2: every process's CPU per token rose alike.
            "plain": [_run(2000.0, 100.0, 250.0, 10.0), _run(1500.0, 125.0, 312.5, 12.5)],
            "warden": [_run(1900.0, 110.0, 250.0, 10.4), _run(1560.0, 137.5, 312.5, 13.5)],
        },
    }


def test_each_variant_is_read_against_plain_in_the_same_round() -> None:
    text = report(_results())
    warden = next(line for line in text.splitlines() if line.startswith("| warden |"))
    # API CPU per completed request against plain's of the same round: 1.04 and 1.08.
    assert warden == "| warden | 0.950 / 1.040 | 0.995 | 0.440 | 1.100 | 1.060 (1.040-1.080) | 0 |"
    plain = next(line for line in text.splitlines() if line.startswith("| plain |"))
    assert plain == "| plain | 1.000 / 1.000 | 1.000 | 0.400 | 1.000 | 1.000 (1.000-1.000) | 0 |"
    assert text.startswith("2 rounds, 750 requests at 50/s per variant and round; engine on")
    assert "side by side" not in text.splitlines()[0]


def test_a_side_by_side_run_says_so() -> None:
    results = {**_results(), "side_by_side": True}
    assert (
        report(results)
        .splitlines()[0]
        .endswith("; the variants side by side (loaded at the same time)")
    )


def test_results_saved_before_the_per_request_reading_still_report() -> None:
    results = _results()
    for runs in results["runs"].values():
        for run in runs:
            del run["api_ms_per_request"]
    warden = next(line for line in report(results).splitlines() if line.startswith("| warden |"))
    assert warden == "| warden | 0.950 / 1.040 | 0.995 | 0.440 | 1.100 | - | 0 |"


def test_metered_functions_are_read_per_request_against_plain_in_the_same_round() -> None:
    results = _results()
    label = "vllm.v1.engine.output_processor:OutputProcessor.process_outputs"
    plain, warden = results["runs"]["plain"], results["runs"]["warden"]
    plain[0]["hooks"], plain[1]["hooks"] = {label: 2.0}, {label: 2.5}
    warden[0]["hooks"], warden[1]["hooks"] = {label: 2.2, "collector thread": 0.4}, {label: 3.0}
    text = report(results)
    assert text.index("| variant |") < text.index("| metered in the API server |")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "-" not in line[:3]]
    # 1.1 and 1.2 of plain's, round by round; plain has no collector thread: no ratio.
    assert f"| {label} | warden | 2.600 (2.200-3.000) | 1.150 |" in rows
    assert f"| {label} | plain | 2.250 (2.000-2.500) | 1.000 |" in rows
    assert "| collector thread | warden | 0.200 (0.000-0.400) | - |" in rows
    assert "metered in the API server" not in report(_results())  # none without --hook


def test_every_variant_runs_in_every_place() -> None:
    names = ["plain", "warden", "warden_no_plugins"]
    orders = [rotated(names, i) for i in range(3)]
    assert orders[1] == ["warden", "warden_no_plugins", "plain"]
    for place in range(3):
        assert sorted(order[place] for order in orders) == sorted(names)


def test_unknown_variants_and_absurd_loads_are_refused_before_any_engine_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--variants", "plain,warden_typo", "--workdir", "/nonexistent/x"]) == 2
    assert "warden_typo" in capsys.readouterr().err
    assert main(["--variants", "warden"]) == 2
    assert "no plain" in capsys.readouterr().err
    assert main(["--client-cpus", "x"]) == 2
    assert "--client-cpus x" in capsys.readouterr().err
    assert main(["--hook", "vllm.v1.engine.output_processor"]) == 2
    assert "module:function or module:Class.method" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--rate", "0"])
