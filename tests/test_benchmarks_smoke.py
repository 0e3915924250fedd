"""Every benchmark command, run in a short mode, so one the code has left behind fails here.

benchmarks/README.md quotes figures with the command that produced them; a command that no
longer runs (it waits for a step the scenario dropped, reads a metric that was renamed) turns
every figure it backs into a claim nobody can reproduce. Each case runs the command as a person
would (``python -m benchmarks.NAME``), with parameters that make it short, and checks that it
exits 0 and writes its result. The closed-loop benchmark plays the same scenario as
tests/test_closed_loop_e2e.py, which also checks that its steps are the scenario's. The
commands that start no engine are in tests/test_benchmarks_offline_smoke.py: they need no core
of an engine worker's, and run beside the rest (tests/support/parallel.py).

Figures from these runs mean nothing: too short, on a shared machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.benchmark_runs import result, run_benchmark


@pytest.mark.engine
def test_series_budget(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "series.json"
    run_benchmark(
        "series_budget", "--model", str(tiny_model), "--requests", "2", "--json", str(out)
    )
    result(out)


@pytest.mark.engine
def test_webhook_latency(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "webhook.json"
    run_benchmark(
        "webhook_latency",
        *("--model", str(tiny_model), "--count", "20", "--clients", "2", "--unique", "20"),
        *("--phase-s", "10", "--workdir", str(tmp_path / "work"), "--out", str(out)),
    )
    result(out)


@pytest.mark.engine
def test_saturation(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "saturation.json"
    run_benchmark(
        "saturation",
        *("--model", str(tiny_model), "--duration", "4", "--warmup", "2", "--rounds", "1"),
        *("--loads", "1", "--no-constant", "--workdir", str(tmp_path / "work"), "--out", str(out)),
    )
    result(out)
