"""Every benchmark command, run in a short mode, so one the code has left behind fails here.

benchmarks/README.md quotes figures with the command that produced them; a command that no
longer runs (it waits for a step the scenario dropped, reads a metric that was renamed) turns
every figure it backs into a claim nobody can reproduce. Each case runs the command as a person
would (``python -m benchmarks.NAME``), with parameters that make it short, and checks that it
exits 0 and writes its result. The closed-loop benchmark plays the same scenario as
tests/test_closed_loop_e2e.py, which also checks that its steps are the scenario's.

Figures from these runs mean nothing: too short, on a shared machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(name: str, *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def result(path: Path) -> dict:
    data = json.loads(path.read_text())
    assert isinstance(data, dict) and data, data
    return data


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
