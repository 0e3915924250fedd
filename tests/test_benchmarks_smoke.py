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

from benchmarks import api_cpu_probe
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


@pytest.mark.engine
def test_hook_ablation_side_by_side(tiny_model: Path, tmp_path: Path) -> None:
    """Two plain engines loaded at the same time: both clients run over one span of time (the
    point of the mode), and each run reads the API server's CPU per request and that of the
    vLLM function metered in it (``--hook``); each engine runs the batch asked for."""
    out = tmp_path / "ablation.json"
    hook = "vllm.v1.engine.output_processor:OutputProcessor.process_outputs"
    run_benchmark(
        "hook_ablation",
        *("--side-by-side", "--variants", "plain,plain_control", "--rate", "4"),
        *("--requests", "12", "--rounds", "1", "--max-num-seqs", "4", "--model", str(tiny_model)),
        *("--hook", hook, "--workdir", str(tmp_path / "work"), "--out", str(out)),
    )
    found = result(out)
    assert found["side_by_side"] is True and found["max_num_seqs"] == 4
    for name in ("plain", "plain_control"):  # vLLM logs the arguments it was given
        assert "'max_num_seqs': 4" in (tmp_path / "work" / name / "engine.log").read_text()
    (plain,), (control,) = found["runs"]["plain"], found["runs"]["plain_control"]
    for run in (plain, control):
        assert run["failed"] == 0 and run["api_ms_per_request"] > 0
        assert 0 < run["hooks"][hook] < run["api_ms_per_request"]
    # Each started before the other ended: loaded together, not one after the other.
    assert plain["started_at"] < control["ended_at"] and control["started_at"] < plain["ended_at"]


@pytest.mark.engine
def test_api_cpu_breakdown(tiny_model: Path, tmp_path: Path) -> None:
    """The meters reach a live API server: its stat logger, collector thread and middleware
    each report calls, and the middleware's own CPU is less than its total."""
    out = tmp_path / "breakdown.json"
    run_benchmark(
        "api_cpu_breakdown",
        *("--rate", "4", "--requests", "12", "--rounds", "1", "--settle-s", "0"),
        *("--max-num-seqs", "4", "--model", str(tiny_model)),
        *("--workdir", str(tmp_path / "work"), "--out", str(out)),
    )
    assert "'max_num_seqs': 4" in (tmp_path / "work" / "warden" / "engine.log").read_text()
    (found,) = result(out)["rounds"]
    assert found["completed"] == 12 and found["failed"] == 0
    hooks = {row["hook"]: row for row in found["hooks"]}
    for hook in ("stat logger: record", "collector thread", "middleware, its own"):
        assert hooks[hook]["calls_per_request"] > 0, hook
    own, total = hooks["middleware, its own"], hooks["middleware with the app"]
    assert 0 < own["ms_per_request"] < total["ms_per_request"]


@pytest.mark.engine
def test_api_cpu_breakdown_of_plain_vllm(tiny_model: Path, tmp_path: Path) -> None:
    """``--variant plain`` meters plain vLLM's API server: the vLLM function asked for is
    metered there, and none of warden's hooks exists in it (a warden engine's stat logger
    runs after every step)."""
    out = tmp_path / "breakdown.json"
    hook = "vllm.v1.engine.output_processor:OutputProcessor.process_outputs"
    run_benchmark(
        "api_cpu_breakdown",
        *("--variant", "plain", "--rate", "4", "--requests", "12", "--rounds", "1"),
        *("--settle-s", "0", "--max-num-seqs", "4", "--model", str(tiny_model), "--hook", hook),
        *("--workdir", str(tmp_path / "work"), "--out", str(out)),
    )
    assert "'max_num_seqs': 4" in (tmp_path / "work" / "plain" / "engine.log").read_text()
    found = result(out)
    assert found["variant"] == "plain"
    (round_found,) = found["rounds"]
    assert round_found["completed"] == 12 and round_found["failed"] == 0
    hooks = {row["hook"]: row for row in round_found["hooks"]}
    assert hooks[hook]["calls_per_request"] > 0
    assert not {label for *_, label in api_cpu_probe.HOOKS} & set(hooks)
