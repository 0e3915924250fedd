"""Every dashboard query through a real Prometheus, and the PNG renderer, without an engine.

A small exporter serves every catalog metric (built with warden's own metric objects) with
moving values, so each panel has something to show; the engine test in
``test_dashboards_live.py`` then checks the same queries against a real vLLM.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as CONTENT_TYPE_PLAIN

from alerts import fleet
from alerts.config import ALERTMANAGER_JOB, ENGINE_JOB, RELAY_JOB
from alerts.rules_file import render_rules
from dashboards import promql
from dashboards.generate import dashboard_models
from dashboards.model import annotation_queries, panel_queries, variable_queries
from dashboards.render import legend_text, render_dashboards
from dashboards.units import format_value
from exporter import catalog
from exporter.metrics import KNOWN_LABEL_VALUES, WardenMetrics
from tests.support.prometheus import (
    PrometheusServer,
    ScrapeTarget,
    prometheus_available,
    running_prometheus,
)
from warden.common.ports import free_port

pytestmark = pytest.mark.skipif(not prometheus_available(), reason="prometheus not on PATH")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def coloured_fraction(png: Path) -> float:
    """Share of strongly coloured pixels: ~0 for frames and titles alone, more with data.

    Backgrounds, grid and text are grey; only series, values and states are saturated.
    """
    pixels = mpimg.imread(png)[..., :3]
    saturation = pixels.max(axis=2) - pixels.min(axis=2)
    return float((saturation > 0.25).mean())


def assert_drawn(paths: list[Path]) -> None:
    for path in paths:
        content = path.read_bytes()
        assert content.startswith(PNG_SIGNATURE), path
        assert coloured_fraction(path) > 0.002, f"{path} shows no data"


# The fleet labels of the default mixin config, as service discovery would attach them.
FLEET_LABELS = {"cluster": "synthetic", "namespace": "warden"}
# Label values of series warden does not export itself (Alertmanager's integrations).
OTHER_LABEL_VALUES = {"integration": ("webhook", "email")}


def _label_values(spec: catalog.MetricSpec) -> list[tuple[str, ...]]:
    """Two label combinations per labelled metric, from the catalog's known values."""
    if not spec.labels:
        return [()]
    known = {**KNOWN_LABEL_VALUES.get(spec.name, {}), **OTHER_LABEL_VALUES}
    choices = [known.get(label, ("a", "b")) for label in spec.labels]
    return [tuple(c[i % len(c)] for c in choices) for i in range(2)]


class SyntheticExporter:
    """Every catalog metric on a private registry, changed a little every 100 ms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = WardenMetrics(self.registry)
        self.metrics.ensure(catalog.ALL)
        self.port = free_port()
        self._stop = threading.Event()
        self._rng = random.Random(0)
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        """Always the classic text format, as vLLM's own /metrics route answers.

        prometheus_client's negotiating handlers give Prometheus OpenMetrics with
        "escaping=underscores", which writes "vllm:x" samples as "vllm_x"
        (prometheus/client_python#1177); vLLM's route is not affected.
        """
        registry = self.registry

        class Metrics(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_PLAIN)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        return Metrics

    def _tick(self, t: float) -> None:
        for spec in catalog.ALL:
            metric = self.metrics.get(spec)
            for values in _label_values(spec):
                child = metric.labels(*values) if values else metric
                if spec.kind == "counter":
                    child.inc(self._rng.random())
                elif spec.kind == "histogram":
                    child.observe(self._rng.random() * 2)
                elif spec.name == catalog.ENGINE_LAST_STEP.name:
                    child.set(time.time())
                elif spec.unit in ("bool", "none") or spec.name == catalog.CIRCUIT_BREAKER_STATE:
                    child.set(int(t) % 2)
                elif spec.unit == "percentunit":
                    child.set(0.5 + 0.4 * math.sin(t / 5))
                else:
                    child.set(1e9 + 1e8 * math.sin(t / 5))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._tick(time.time())
            time.sleep(0.1)

    def __enter__(self) -> SyntheticExporter:
        self._tick(time.time())
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusServer]:
    """A real Prometheus that has scraped the synthetic exporter for a few seconds, as the
    engines' job and, for the fleet dashboard's delivery row, as Alertmanager's and the relay's
    (their metrics are in the catalog too), with warden's generated rules loaded."""
    with SyntheticExporter() as exporter:
        targets = [
            ScrapeTarget(exporter.url, job=job, labels=FLEET_LABELS)
            for job in (ENGINE_JOB, ALERTMANAGER_JOB, RELAY_JOB)
        ]
        with running_prometheus(targets, rule_files=_rules()) as prom:
            prom.wait_for_targets_up()
            prom.wait_for(f"count_over_time({catalog.MEMORY_WATERMARK.name}[1m]) >= 6", timeout=30)
            prom.wait_for('ALERTS{alertstate="firing"}', timeout=30)
            for record in (fleet.SLO_BY_MODEL, fleet.ERROR_RATIO_BY_MODEL, fleet.FINISH_SHARE):
                prom.wait_for(record, timeout=30)
            yield prom


def _rules() -> list[Path]:
    """An alert that always fires, so the alert panels have a series to show, and warden's
    rules, whose fleet records the fleet dashboard reads."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="warden-rules-"))
    probe = folder / "probe.yml"
    probe.write_text(
        "groups:\n- name: probe\n  rules:\n  - alert: WardenDashboardProbe\n"
        "    expr: vector(1)\n    labels: {severity: info}\n"
    )
    rules = folder / "rules.yml"
    rules.write_text(render_rules())
    return [probe, rules]


def _models() -> dict[str, dict[str, Any]]:
    return dashboard_models()


def test_every_panel_query_returns_data_when_every_metric_exists(
    prometheus: PrometheusServer,
) -> None:
    values = promql.all_values("30s")
    empty = []
    for model in _models().values():
        for query in panel_queries(model):
            result = prometheus.query(promql.expand(query.expr, values))
            if not result:
                empty.append(query.where)
    assert not empty, f"panels without data although every metric exists: {empty}"


def test_annotation_queries_are_valid_promql(prometheus: PrometheusServer) -> None:
    values = promql.all_values("30s")
    for model in _models().values():
        for expr in annotation_queries(model).values():
            now = time.time()
            prometheus.query_range(promql.expand(expr, values), now - 60, now, 5)


def test_variable_queries_find_the_target(prometheus: PrometheusServer) -> None:
    values = promql.all_values()
    for model in _models().values():
        for name, query in variable_queries(model).items():
            selector, label = promql.parse_label_values(query)
            assert selector is not None
            series = prometheus.series(promql.expand(selector, values))
            assert series, f"variable {name}: no series for {selector}"
            if label != "model_name":  # the synthetic exporter has no model label
                assert {s.get(label) for s in series} - {None}, f"variable {name}: no {label}"


def test_render_draws_one_png_per_dashboard(prometheus: PrometheusServer, tmp_path: Path) -> None:
    paths = render_dashboards(
        prometheus.url, tmp_path, minutes=2, scrape_interval="1s", strict=True
    )
    assert [p.name for p in paths] == [f"{uid}.png" for uid in _models()]
    assert_drawn(paths)


def test_render_one_dashboard_and_refuse_unknown(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    paths = render_dashboards(prometheus.url, tmp_path, 1, ["warden-memory"], scrape_interval="1s")
    assert [p.name for p in paths] == ["warden-memory.png"]
    with pytest.raises(ValueError, match="unknown dashboard"):
        render_dashboards(prometheus.url, tmp_path, 1, ["nope"])


def test_units_read_like_grafana() -> None:
    assert format_value(0.5, "percentunit") == "50%"
    assert format_value(3 * 1024**3, "bytes") == "3 GiB"
    assert format_value(0.0123, "s") == "12.3 ms"
    assert format_value(2.5, "reqps") == "2.5 req/s"
    assert format_value(1, "bool") == "True"
    assert format_value(1_234_567, "short") == "1.23 Mil"
    assert format_value(float("nan"), "s") == "NaN"


def test_legends_follow_grafana_templating() -> None:
    labels = {"__name__": "x", "source": "kv_cache", "instance": "a:1"}
    assert legend_text("{{source}} @ {{instance}}", labels, "x") == "kv_cache @ a:1"
    assert legend_text("", {"__name__": "x"}, "x") == "x"
    assert legend_text("", {"source": "kv"}, "expr") == '{source="kv"}'
