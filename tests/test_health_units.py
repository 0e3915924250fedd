"""Readiness and health logic without an engine: windows over sampled metrics, quantiles, the
checks, and the routes with a stand-in engine client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from exporter import catalog
from exporter.metrics import WardenMetrics
from exporter.supervisor_state import STATE_ENV_VAR, SupervisorState
from warden.engine import health, runtime
from warden.engine.runtime import EngineRuntime


def test_quantile_interpolates_like_histogram_quantile() -> None:
    buckets = [(0.1, 0.0), (0.5, 50.0), (1.0, 100.0), (float("inf"), 100.0)]
    assert health.quantile(0.5, buckets) == pytest.approx(0.5)
    assert health.quantile(0.25, buckets) == pytest.approx(0.3)
    assert health.quantile(0.99, buckets) == pytest.approx(0.99)
    assert health.quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None
    # Everything above the last finite bound: the bound is the best answer.
    assert health.quantile(0.5, [(1.0, 0.0), (float("inf"), 4.0)]) == 1.0


def _families(requests: dict[str, float], ttft: list[tuple[str, float]]) -> list[Any]:
    counter = CounterMetricFamily(catalog.REQUESTS.base, "", labels=["outcome"])
    for outcome, value in requests.items():
        counter.add_metric([outcome], value)
    hist = HistogramMetricFamily(catalog.VLLM_TTFT.name, "", labels=["model_name"])
    hist.add_metric(["m"], buckets=ttft, sum_value=0.0)
    return [counter, hist]


class FakeSource:
    """Metric families that a test changes between samples, and a clock it moves."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.families: list[Any] = _families({}, [("+Inf", 0.0)])

    def read(self) -> list[Any]:
        return self.families

    def clock(self) -> float:
        return self.now


def test_windows_report_deltas_over_the_asked_span() -> None:
    source = FakeSource()
    windows = health.MetricWindows(source.read, clock=source.clock)
    source.families = _families(
        {"success": 10, "server_error": 0}, [("0.1", 0.0), ("1.0", 0.0), ("+Inf", 0.0)]
    )
    windows.sample()
    source.now += 100
    source.families = _families(
        {"success": 30, "server_error": 5}, [("0.1", 0.0), ("1.0", 10.0), ("+Inf", 10.0)]
    )
    windows.sample()
    source.now += 50
    source.families = _families(
        {"success": 40, "server_error": 5}, [("0.1", 10.0), ("1.0", 20.0), ("+Inf", 20.0)]
    )
    windows.sample()
    last_minute = windows.window(60)
    assert last_minute.covered_s == 50
    assert last_minute.by_label(catalog.REQUESTS.name) == {"success": 10.0, "server_error": 0.0}
    assert last_minute.histogram_quantiles(catalog.VLLM_TTFT.name)["p50"] == pytest.approx(0.05)
    whole = windows.window(900)
    assert whole.covered_s == 150  # less history than asked: it says how much it covers
    assert whole.by_label(catalog.REQUESTS.name)["server_error"] == 5.0
    assert whole.histogram_quantiles(catalog.VLLM_TTFT.name)["p99"] == pytest.approx(0.982)


def test_error_rate_check_needs_enough_requests_and_a_high_rate() -> None:
    source = FakeSource()
    windows = health.MetricWindows(source.read, clock=source.clock)
    source.families = _families({"success": 0, "server_error": 0}, [("+Inf", 0.0)])
    windows.sample()
    source.now += 30
    source.families = _families({"success": 1, "server_error": 4}, [("+Inf", 0.0)])
    windows.sample()
    metrics = WardenMetrics(CollectorRegistry())
    assert health.check_error_rate(windows, metrics).ok, "5 requests are too few to judge"
    source.now += 10
    source.families = _families({"success": 2, "server_error": 20, "rejected": 50}, [("+Inf", 0.0)])
    windows.sample()
    check = health.check_error_rate(windows, metrics)
    assert not check.ok and "20/22 server errors" in check.detail


def test_error_rate_check_reads_the_circuit_breaker_of_its_own_metrics() -> None:
    source = FakeSource()
    windows = health.MetricWindows(source.read, clock=source.clock)
    metrics = WardenMetrics(CollectorRegistry())
    assert health.check_error_rate(windows, metrics).ok
    metrics.get(catalog.CIRCUIT_BREAKER_STATE).set(catalog.CIRCUIT_STATES.index("open"))
    check = health.check_error_rate(windows, metrics)
    assert not check.ok and "circuit breaker open" in check.detail


def test_supervisor_checks_read_the_circuit_and_drain_flags() -> None:
    assert health.check_supervisor(None) == []
    closed = {c.name: c.ok for c in health.check_supervisor(SupervisorState())}
    assert closed == {"supervisor_circuit": True, "draining": True}
    opened = health.check_supervisor(
        SupervisorState(circuit_open=True, circuit_reason="3 restarts", draining=True)
    )
    assert [(c.name, c.ok, c.detail) for c in opened] == [
        ("supervisor_circuit", False, "3 restarts"),
        ("draining", False, "draining for a restart"),
    ]


class FakeEngineClient:
    def __init__(self, dead: bool = False) -> None:
        self.dead = dead

    async def check_health(self) -> None:
        if self.dead:
            raise RuntimeError("engine dead")

    async def get_status(self) -> dict[str, Any]:
        return {"engines": []}

    async def collective_rpc(self, method: str) -> list[dict[str, Any]]:
        assert method == "warden_device_memory"
        return [{"device": "cpu"}]


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    state = SupervisorState()
    event = state.record_restart("crash", 100.0, 101.0, "")
    state.record_ready(event, 100.0, 130.0)
    path = tmp_path / "supervisor-state.json"
    state.save(path)
    monkeypatch.setenv(STATE_ENV_VAR, str(path))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    app = FastAPI()
    app.include_router(health.router)
    runtime.install(app, EngineRuntime.build())
    app.state.engine_client = FakeEngineClient()
    with TestClient(app) as test_client:
        yield test_client


def test_ready_when_every_check_passes(client: TestClient) -> None:
    response = client.get("/warden/ready")
    assert response.status_code == 200, response.json()
    assert response.json()["ready"] is True
    assert {"engine", "stalled", "memory", "error_rate", "supervisor_circuit"} <= set(
        response.json()["checks"]
    )


def test_not_ready_lists_the_failing_checks(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.app.state.engine_client = FakeEngineClient(dead=True)  # type: ignore[attr-defined]
    state = SupervisorState()
    state.open_circuit("6 restarts in the last 3600s (limit 5)", 1.0)
    state.save(tmp_path / "open.json")
    monkeypatch.setenv(STATE_ENV_VAR, str(tmp_path / "open.json"))
    response = client.get("/warden/ready")
    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["engine", "supervisor_circuit"]
    assert "limit 5" in body["checks"]["supervisor_circuit"]["detail"]


def test_health_view_has_memory_windows_and_restarts(client: TestClient) -> None:
    body = client.get("/warden/health").json()
    assert body["device_memory"] == [{"device": "cpu"}]
    assert set(body["windows"]) == {"60s", "300s", "900s"}
    window = body["windows"]["300s"]
    for key in ("requests_per_s", "ttft_s", "inter_token_s", "errors", "preemptions", "restarts"):
        assert key in window
    assert body["supervisor"]["restart_totals"]["crash"] == 1


def test_a_cuda_driver_error_fails_readiness_until_the_engine_restarts() -> None:
    counter = CounterMetricFamily(catalog.ENGINE_ERRORS.base, "", labels=["class"])
    counter.add_metric(["oom"], 3.0)
    counter.add_metric(["cuda_driver"], 0.0)
    windows = health.MetricWindows(lambda: [counter])
    windows.sample()
    assert health.check_driver_errors(windows).ok, "OOM is recoverable"
    counter = CounterMetricFamily(catalog.ENGINE_ERRORS.base, "", labels=["class"])
    counter.add_metric(["cuda_driver"], 1.0)
    windows = health.MetricWindows(lambda: [counter])
    windows.sample()
    check = health.check_driver_errors(windows)
    assert not check.ok and check.name == "driver_error"


def test_an_unreadable_webhook_token_makes_the_engine_not_ready_and_says_so(
    client: TestClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Kubernetes failure of #12: a Secret mounted 0400 root, read by uid 10001."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    monkeypatch.setenv("WARDEN_WEBHOOK_TOKEN_FILE", str(token))
    assert client.get("/warden/ready").json()["checks"]["webhook_token"]["ok"] is True
    monkeypatch.setenv("WARDEN_WEBHOOK_TOKEN_FILE", str(tmp_path / "missing"))
    with caplog.at_level("ERROR", logger="warden.health"):
        first = client.get("/warden/ready")
        second = client.get("/warden/ready")
    assert first.status_code == second.status_code == 503
    assert first.json()["failing"] == ["webhook_token"]
    assert "cannot read" in first.json()["checks"]["webhook_token"]["detail"]
    logged = [r for r in caplog.records if "webhook token cannot be loaded" in r.getMessage()]
    assert len(logged) == 1, "said once, not at every probe"
