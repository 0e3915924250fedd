"""Every dashboard query against a real vLLM CPU engine with warden, scraped by a real Prometheus.

A short load runs through the engine, then each panel query is executed through Prometheus's
HTTP API exactly as Grafana would send it (variables set to "All"). A query must parse and
return at least one series; a counter the exporter pre-creates at 0 counts as data. The only
exceptions are listed below with their reasons, and the test fails if the list goes stale in
the direction that matters (a listed query that is not GPU-only starts returning data).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from alerts.config import ENGINE_JOB
from alerts.rules_file import render_rules
from dashboards import promql
from dashboards.generate import dashboard_models
from dashboards.model import PanelQuery, annotation_queries, panel_queries, variable_queries
from dashboards.render import render_dashboards
from exporter import catalog
from tests.support.engine import TINY_KV_ARGS, complete, running_engine
from tests.support.prometheus import (
    PrometheusServer,
    ScrapeTarget,
    prometheus_available,
    running_prometheus,
)
from tests.test_dashboards_render import assert_drawn
from warden.common.waiting import wait_until
from warden.supervisor.engine import EngineProcess

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not prometheus_available(), reason="prometheus not on PATH"),
]

# The tests' tiny KV cache: eight long requests fill it, so usage and preemption panels show
# real movement; the requests it cannot hold queue, past the saturation limit below, so the
# saturation panels show admission at work (the KV cache itself refuses nothing, #10.2).
ENGINE_ARGS = TINY_KV_ARGS
SATURATION_CONFIG = "admission:\n  saturation:\n    max_queue_depth: 2\n"
ENGINE_ENV = {
    # vLLM's own NaN counter (vllm:corrupted_requests) exists only with this switch.
    "VLLM_COMPUTE_NANS_IN_LOGITS": "1",
    # The exporter's test switch: one collector always raises, so collector errors have data.
    "WARDEN_TEST_FAILING_COLLECTOR": "1",
}
PROMPT = " ".join(["memory watermark cache block engine request"] * 12)
RATE_INTERVAL = "1m"
RENDER_MINUTES = 1

# Queries that read only GPU-only series (catalog gpu_only=True): never data on a CPU engine.
GPU_ONLY_QUERIES = {
    "warden-memory / Fragmentation / A",
    "warden-memory / Device memory used vs total (NVML) / A",
    "warden-memory / Device memory used vs total (NVML) / B",
    "warden-memory / PyTorch reserved vs allocated / A",
    "warden-memory / PyTorch reserved vs allocated / B",
    "warden-memory / PyTorch reserved vs allocated / C",
    "warden-memory / PyTorch reserved vs allocated / D",
    "warden-memory / Fragmentation ratio / A",
    "warden-memory / CUDA graph captures / A",
    "warden-memory / CUDA graph pool memory / A",
    "warden-memory / Allocator retries and OOMs (5 min) / A",
    "warden-memory / Allocator retries and OOMs (5 min) / B",
    # This engine's own device memory (NVML per process) and what the device risk counts.
    "warden-memory / Device memory used vs total (NVML) / C",
    "warden-memory / Device risk counts / A",
    # Memory beyond the engine's plan: device and allocator sources (the host one has data).
    "warden-memory / Projected time to OOM / A",
    "warden-memory / Planned footprint / A",
    "warden-memory / Utilization by source / A",
    "warden-memory / Utilization by source over time / A",
    "warden-memory / Projected utilization in 1 h / A",
}
# Other queries allowed to be empty in this test, with the reason. Event counters the exporter
# does not pre-create appear with their first event; the supervisor's series come from the
# supervisor process, which this test does not run (it starts the engine directly).
SUPERVISOR = "exported by the supervisor process, not run here"
ABSENT_HERE: dict[str, str] = {
    "warden-overview / Admission rejections / A": "first warden rejection creates the series "
    "(saturation refuses under this test only when the requests overlap enough)",
    "warden-faults / Retries by reason (5 min) / B": "first request failing its last retry "
    "creates the series",
    "warden-faults / Webhook notifications by outcome (5 min) / A": "first Alertmanager "
    "notification creates the series",
    "warden-faults / Supervisor / A": SUPERVISOR,
    "warden-faults / CUDA graphs / A": SUPERVISOR,
    "warden-faults / Restarts (1h) / A": SUPERVISOR,
    "warden-faults / Engine restarts by reason (5 min) / A": SUPERVISOR,
    "warden-faults / Restart duration / A": SUPERVISOR,
    "warden-faults / Restart duration / B": SUPERVISOR,
    "warden-memory / Memory beyond the plan (risk) / B": SUPERVISOR,
    **{
        f"warden-fleet / {panel}": "Alertmanager and warden relay do not run in this test "
        "(tests/test_dashboards_render.py has data for them)"
        for panel in (
            "Engines the relay knows / A",
            "Alertmanager webhook failures / A",
            "Relay: alerts by outcome / A",
            "Relay: deliveries and notifications / A",
            "Relay: deliveries and notifications / B",
        )
    },
}
# The engine as service discovery would label it in a fleet: the dashboards' cluster and
# namespace variables must find it.
FLEET_LABELS = {"cluster": "local", "namespace": "warden"}


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    run_dir = tmp_path_factory.mktemp("dashboards-engine")
    config = run_dir / "warden.yaml"
    config.write_text(SATURATION_CONFIG)
    env = {**ENGINE_ENV, "WARDEN_CONFIG": str(config)}
    with running_engine(tiny_model, extra_args=ENGINE_ARGS, env=env, run_dir=run_dir) as eng:
        yield eng


@pytest.fixture(scope="module")
def prometheus(engine: EngineProcess) -> Iterator[PrometheusServer]:
    """Prometheus scraping the engine every second, with an alert that always fires and
    warden's own rules (the fleet dashboard reads their records)."""
    run_dir = Path(engine.spec.run_dir or ".")
    probe = run_dir / "dashboard-probe-rules.yml"
    probe.write_text(
        "groups:\n- name: probe\n  rules:\n  - alert: WardenDashboardProbe\n"
        "    expr: vector(1)\n    labels: {severity: info}\n"
    )
    rules = run_dir / "rules.yml"
    rules.write_text(render_rules())
    target = ScrapeTarget(engine.metrics_url, job=ENGINE_JOB, labels=FLEET_LABELS)
    with running_prometheus([target], rule_files=[probe, rules]) as prom:
        prom.wait_for_targets_up(timeout=60)
        yield prom


def _load(engine: EngineProcess, rounds: int = 3, concurrency: int = 8) -> dict[int, int]:
    """Rounds of concurrent long requests; returns how many got each HTTP status.

    The tiny KV cache makes requests queue; past the queue limit saturation admission refuses
    (503 with Retry-After) part of the time: that is the behaviour the dashboards exist to
    show, so it is expected alongside 200.
    """
    model = str(engine.spec.model)
    statuses: dict[int, int] = {}
    with ThreadPoolExecutor(concurrency) as pool:
        for _ in range(rounds):
            for response in pool.map(
                lambda i: complete(engine, model, f"{i} {PROMPT}", max_tokens=48),
                range(concurrency),
            ):
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
    assert set(statuses) <= {200, 429, 503}, statuses
    assert statuses.get(200), f"no request succeeded: {statuses}"
    return statuses


@pytest.fixture(scope="module")
def loaded(engine: EngineProcess, prometheus: PrometheusServer) -> PrometheusServer:
    """Load the engine, then wait until Prometheus has scraped the aftermath."""
    print(f"\nload: HTTP statuses {_load(engine)}")
    # As a readiness probe would: warden sets its ready/healthy gauges when asked.
    httpx.get(f"{engine.base_url}/warden/ready", timeout=30)
    prometheus.wait_for(
        f"sum(increase({catalog.VLLM_GENERATION_TOKENS.name}[{RATE_INTERVAL}])) > 0", timeout=30
    )
    time.sleep(3)
    return prometheus


def _queries() -> list[PanelQuery]:
    return [q for model in dashboard_models().values() for q in panel_queries(model)]


def test_exception_lists_name_real_queries_and_gpu_ones_read_only_gpu_series() -> None:
    by_where = {q.where: q for q in _queries()}
    gpu_series = {
        name for spec in catalog.ALL if spec.gpu_only for name in catalog.series_names(spec)
    }
    for where in GPU_ONLY_QUERIES | set(ABSENT_HERE):
        assert where in by_where, f"no such panel query: {where}"
    for where in GPU_ONLY_QUERIES:
        names = promql.metric_names(by_where[where].expr)
        assert names <= gpu_series, f"{where} reads non-GPU series {names - gpu_series}"


def test_every_panel_query_returns_data_from_a_real_engine(loaded: PrometheusServer) -> None:
    values = promql.all_values(RATE_INTERVAL)
    empty, excused = [], []
    queries = _queries()
    for query in queries:
        result = loaded.query(promql.expand(query.expr, values))  # raises on bad PromQL
        if result:
            continue
        if query.where in GPU_ONLY_QUERIES or query.where in ABSENT_HERE:
            excused.append(query.where)
        else:
            empty.append(query.where)
    print(f"\n{len(queries)} panel queries: {len(queries) - len(empty) - len(excused)} with data, "
          f"{len(excused)} excused empty: {excused}")  # fmt: skip
    assert not empty, f"panel queries without data: {empty}"


def test_variables_and_annotations_run_against_the_engine(loaded: PrometheusServer) -> None:
    values = promql.all_values(RATE_INTERVAL)
    for model in dashboard_models().values():
        for name, query in variable_queries(model).items():
            selector, label = promql.parse_label_values(query)
            assert selector is not None
            found = {s.get(label) for s in loaded.series(promql.expand(selector, values))}
            assert found - {None}, f"variable {name}: no values of {label} in {selector}"
        for expr in annotation_queries(model).values():
            now = time.time()
            loaded.query_range(promql.expand(expr, values), now - 300, now, 60)


def _first_scrape(prometheus: PrometheusServer) -> float:
    """When Prometheus first scraped the engine (its oldest ``up`` sample)."""
    now = time.time()
    series = prometheus.query_range("up", now - 900, now, 1)
    return min(float(s["values"][0][0]) for s in series)


def test_render_draws_every_dashboard_from_the_engine(
    loaded: PrometheusServer, tmp_path: Path
) -> None:
    """Every chart spans a full window of data, however fast the run got here: the window is
    the last RENDER_MINUTES and render waits until Prometheus has scraped that long. (A window
    longer than the data drew lines as long as the run was slow: the memory dashboard, with
    its few CPU series, fell under the drawn floor on fast runs.)"""
    full_from = _first_scrape(loaded) + RENDER_MINUTES * 60 + 2
    wait_until(lambda: time.time() >= full_from, 120, 0.5, "a full window of scrapes")
    paths = render_dashboards(
        loaded.url, tmp_path, minutes=RENDER_MINUTES, scrape_interval="1s", strict=True
    )
    assert [p.stem for p in paths] == list(dashboard_models())
    assert_drawn(paths)
