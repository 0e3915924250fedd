"""The benchmark commands that start no engine, run in a short mode (as
tests/test_benchmarks_smoke.py says why): the Retry-After simulation, the middleware's cost in
process, and the logits copy on the CPU. Apart from the engine benchmarks so that they run on
any worker, not on an engine worker's core between the load-calibrated runs
(tests/support/parallel.py).

Figures from these runs mean nothing: too short, on a shared machine."""

from __future__ import annotations

from pathlib import Path

from tests.support.benchmark_runs import result, run_benchmark


def test_retry_after(tmp_path: Path) -> None:
    out = tmp_path / "retry.json"
    run_benchmark("retry_after", "--clients", "8", "--duration", "20", "--out", str(out))
    result(out)


def test_middleware_overhead_in_process(tmp_path: Path) -> None:
    out = tmp_path / "middleware.json"
    run_benchmark(
        "middleware_overhead", "--no-e2e", "--rounds", "2", "--block", "20", "--out", str(out)
    )
    result(out)


def test_logits_copy(tmp_path: Path) -> None:
    out = tmp_path / "logits_copy.json"
    run_benchmark(
        "logits_copy",
        *("--device", "cpu", "--iterations", "1", "--rows", "2", "--vocab", "64"),
        *("--json", str(out)),
    )
    assert result(out)["results"][0]["copy_mib"] >= 0
