"""The generated dashboards and provisioning, checked as files: no Grafana, no Prometheus."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.config import DEFAULT
from alerts.fleet import FLEET_RECORDING
from dashboards.datasource import DATASOURCE_TYPE, DATASOURCE_UID
from dashboards.generate import GENERATED_DIR, REPO_ROOT, dashboard_models, render_all
from dashboards.model import (
    annotation_queries,
    panel_queries,
    panel_unit,
    panels,
    variable_queries,
)
from dashboards.promql import (
    PromQLScanError,
    grouping_labels,
    matcher_labels,
    metric_names,
    parse_label_values,
    variables,
)
from dashboards.provisioning import (
    DASHBOARD_PROVIDER_FILE,
    DATASOURCE_FILE,
    GRAFANA_DASHBOARDS_PATH,
)
from exporter import catalog

EXPECTED_UIDS = {"warden-overview", "warden-memory", "warden-faults", "warden-fleet"}
FLEET_UID = "warden-fleet"
# The fleet dashboard reads the fleet recording rules (alerts/fleet.py).
FLEET_RECORDS = {rule.record: rule for rule in FLEET_RECORDING.rules if hasattr(rule, "record")}
MODERN_PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "state-timeline"}

# Grafana unit ids (packages/grafana-data/src/valueFormats/categories.ts) that make sense for
# this project; a typo or an invented unit renders as a bare number in Grafana.
GRAFANA_UNITS = {
    "none",
    "short",
    "percent",
    "percentunit",
    "bool",
    "bool_yes_no",
    "bool_on_off",
    "bytes",
    "decbytes",
    "kbytes",
    "mbytes",
    "gbytes",
    "ns",
    "µs",
    "ms",
    "s",
    "m",
    "h",
    "d",
    "dtdurations",
    "dateTimeAsIso",
    "dateTimeFromNow",
    "cps",
    "ops",
    "reqps",
    "cpm",
    "opm",
}

# Labels Prometheus or vLLM add to series beyond the catalog's own label lists (the fleet
# labels of the default mixin config come from service discovery or external labels).
TARGET_LABELS = {"job", "instance", *DEFAULT.fleet_labels}
VLLM_IMPLICIT_LABELS = {"model_name", "engine"}
ALERTS_LABELS = {"alertname", "alertstate", "severity"}
VARIABLES = {"job", "instance", "model", "__rate_interval", *DEFAULT.fleet_labels}
# Series of other jobs the fleet dashboard shows, picked by the mixin config's selectors.
OTHER_JOBS = {catalog.ALERTMANAGER_NOTIFICATIONS_FAILED.name} | {
    spec.name for spec in catalog.ALL if spec.name.startswith("warden_relay_")
}

# Catalog metrics deliberately shown on no dashboard, and why.
NOT_ON_A_DASHBOARD = {
    catalog.EXPORTER_INFO.name: "version/device labels only; nothing to plot",
    catalog.VLLM_CACHE_CONFIG_INFO.name: "configuration labels only",
    catalog.VLLM_REQUEST_SUCCESS.name: "warden_requests_total by outcome covers it",
    catalog.NONFINITE_FLAG_WAIT.name: "a latency cost of the NaN check (0 on CPU); GPU figures "
    "live in benchmarks/README.md until a GPU run says a panel is worth its space",
}


@pytest.fixture(scope="module")
def models() -> dict[str, dict[str, Any]]:
    return dashboard_models()


def all_queries(models: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """(where, expr) of every panel query and every annotation query."""
    found = [(q.where, q.expr) for m in models.values() for q in panel_queries(m)]
    for uid, model in models.items():
        found += [(f"{uid} / annotation {n}", e) for n, e in annotation_queries(model).items()]
    return found


def test_dashboards_have_the_stable_uids(models: dict[str, dict[str, Any]]) -> None:
    assert set(models) == EXPECTED_UIDS
    assert {m["uid"] for m in models.values()} == EXPECTED_UIDS
    titles = [m["title"] for m in models.values()]
    assert len(set(titles)) == len(titles), "two dashboards share a title"


def test_panel_ids_are_unique_within_a_dashboard(models: dict[str, dict[str, Any]]) -> None:
    for uid, model in models.items():
        ids = [p["id"] for p in panels(model)]
        assert len(set(ids)) == len(ids), f"{uid}: duplicate panel ids {ids}"


def test_every_query_is_bound_to_the_provisioned_datasource(
    models: dict[str, dict[str, Any]],
) -> None:
    expected = {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}
    provisioned = yaml.safe_load(render_all()[DATASOURCE_FILE])["datasources"]
    assert [d["uid"] for d in provisioned] == [DATASOURCE_UID]
    assert provisioned[0]["type"] == DATASOURCE_TYPE
    for uid, model in models.items():
        for panel in panels(model):
            where = f"{uid} / {panel['title']}"
            assert panel["datasource"] == expected, where
            assert panel["targets"], f"{where}: no queries"
            for target in panel["targets"]:
                assert target["datasource"] == expected, f"{where} / {target['refId']}"
        for variable in model["templating"]["list"]:
            assert variable["datasource"] == expected, f"{uid}: variable {variable['name']}"
        for annotation in model["annotations"]["list"]:
            assert annotation["datasource"] == expected, f"{uid}: {annotation['name']}"


def test_panels_fit_the_grid_without_overlapping(models: dict[str, dict[str, Any]]) -> None:
    for uid, model in models.items():
        boxes = []
        for panel in panels(model):
            grid = panel["gridPos"]
            assert grid["w"] > 0 and grid["h"] > 0, f"{uid} / {panel['title']}"
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, f"{uid} / {panel['title']}"
            boxes.append((panel["title"], grid))
        for (a, ga), (b, gb) in itertools.combinations(boxes, 2):
            apart = (
                ga["x"] + ga["w"] <= gb["x"]
                or gb["x"] + gb["w"] <= ga["x"]
                or ga["y"] + ga["h"] <= gb["y"]
                or gb["y"] + gb["h"] <= ga["y"]
            )
            assert apart, f"{uid}: {a!r} {ga} overlaps {b!r} {gb}"


def test_panels_are_modern_types_with_units_and_descriptions(
    models: dict[str, dict[str, Any]],
) -> None:
    for uid, model in models.items():
        for panel in panels(model):
            where = f"{uid} / {panel['title']}"
            assert panel["type"] in MODERN_PANEL_TYPES, where
            assert panel_unit(panel) in GRAFANA_UNITS, f"{where}: unit {panel_unit(panel)!r}"
            assert len(panel.get("description") or "") >= 30, f"{where}: describe normal"


def test_units_come_from_the_catalog_where_a_panel_shows_one_metric_as_is(
    models: dict[str, dict[str, Any]],
) -> None:
    """A single-metric gauge panel such as KV usage must carry the catalog's unit."""
    checked = 0
    for model in models.values():
        for panel in panels(model):
            names = {n for t in panel["targets"] for n in metric_names(t["expr"])}
            exprs = " ".join(t["expr"] for t in panel["targets"])
            spec = catalog.BY_NAME.get(next(iter(names))) if len(names) == 1 else None
            if spec is None or spec.kind != "gauge" or any(op in exprs for op in "-/*"):
                continue
            assert panel_unit(panel) == spec.unit, f"{panel['title']}: {spec.name}"
            checked += 1
    assert checked >= 10


def test_every_query_reads_only_catalog_series(models: dict[str, dict[str, Any]]) -> None:
    allowed = catalog.KNOWN_SERIES | catalog.PROMETHEUS_BUILTINS | FLEET_RECORDS.keys()
    for where, expr in all_queries(models):
        names = metric_names(expr)
        assert names, f"{where}: no series in {expr!r}"
        assert names <= allowed, f"{where}: unknown series {sorted(names - allowed)}"


def test_variable_queries_read_only_catalog_series(models: dict[str, dict[str, Any]]) -> None:
    allowed = catalog.KNOWN_SERIES | catalog.PROMETHEUS_BUILTINS
    for uid, model in models.items():
        queries = variable_queries(model)
        expected = {*DEFAULT.fleet_labels, "job", "model"}
        assert set(queries) == (expected if uid == FLEET_UID else expected | {"instance"})
        for name, query in queries.items():
            selector, label = parse_label_values(query)
            assert selector is not None, name
            assert metric_names(selector) <= allowed, f"{name}: {selector}"


def _known_labels(expr: str) -> set[str]:
    labels = set(TARGET_LABELS)
    for name in metric_names(expr):
        if name in FLEET_RECORDS:
            labels |= grouping_labels(FLEET_RECORDS[name].render_expr())
            continue
        if name in catalog.PROMETHEUS_BUILTINS:
            labels |= ALERTS_LABELS
            continue
        base = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
        spec = catalog.BY_NAME.get(name) or catalog.BY_NAME[base]
        labels |= set(spec.labels)
        if spec.owner == "vllm":
            labels |= VLLM_IMPLICIT_LABELS
        if name.endswith("_bucket"):
            labels.add("le")
    return labels


def test_queries_group_and_match_only_on_existing_labels(
    models: dict[str, dict[str, Any]],
) -> None:
    for where, expr in all_queries(models):
        used = grouping_labels(expr) | matcher_labels(expr)
        unknown = used - _known_labels(expr)
        assert not unknown, f"{where}: labels {sorted(unknown)} not on {metric_names(expr)}"


def test_queries_use_only_the_dashboard_variables(models: dict[str, dict[str, Any]]) -> None:
    for where, expr in all_queries(models):
        assert variables(expr) <= VARIABLES, f"{where}: {variables(expr) - VARIABLES}"
        if metric_names(expr) == {"ALERTS"}:
            continue  # alerts of the whole Prometheus: alert rules need not keep job/instance
        if metric_names(expr) <= OTHER_JOBS:
            # Alertmanager's and the relay's own series: their jobs, from the config.
            assert DEFAULT.alertmanager_selector in expr or DEFAULT.relay_selector in expr
            continue
        scope = {"job", *DEFAULT.fleet_labels}
        if not where.startswith(FLEET_UID):
            scope.add("instance")
        assert scope <= variables(expr), f"{where}: not scoped to {scope - variables(expr)}"


def test_every_catalog_metric_is_shown_or_deliberately_left_out(
    models: dict[str, dict[str, Any]],
) -> None:
    shown = {
        name.removesuffix("_bucket")
        for _, expr in all_queries(models)
        for name in metric_names(expr)
    }
    missing = {spec.name for spec in catalog.ALL} - shown - set(NOT_ON_A_DASHBOARD)
    assert not missing, f"catalog metrics on no dashboard: {sorted(missing)}"
    assert not set(NOT_ON_A_DASHBOARD) & shown, "listed as left out but shown"


def test_the_scanner_finds_what_it_must() -> None:
    assert metric_names('rate(warden_typo_total{job=~"$job"}[5m])') == {"warden_typo_total"}
    assert metric_names(
        'histogram_quantile(0.99, sum by (le) (rate(vllm:x_bucket{a="b{c}"}[$__rate_interval])))'
    ) == {"vllm:x_bucket"}
    assert metric_names("time() - max(a) > bool 1e-9 or vector(0) offset 5m") == {"a"}
    assert metric_names("x / on(instance) group_left(gpu) y") == {"x", "y"}
    with pytest.raises(PromQLScanError):
        metric_names("histogram_quantil(0.5, x)")
    assert grouping_labels("sum without (a, b) (x) * on(c) y") == {"a", "b", "c"}
    assert matcher_labels('x{job=~"$job", reason!="oom"}') == {"job", "reason"}


def test_generated_files_match_the_sources() -> None:
    """What `warden generate --check` enforces: committed files equal render_all()."""
    rendered = render_all()
    stale = [
        path
        for path, content in rendered.items()
        if not (REPO_ROOT / path).is_file() or (REPO_ROOT / path).read_text() != content
    ]
    assert not stale, f"stale generated files (run `warden generate`): {stale}"
    on_disk = {str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / GENERATED_DIR).glob("*.json")}
    generated = {p for p in rendered if p.startswith(GENERATED_DIR)}
    assert on_disk == generated, f"stray dashboard files: {sorted(on_disk - generated)}"


def test_rendering_is_deterministic() -> None:
    assert render_all() == render_all()


def test_dashboard_provider_reads_the_mounted_generated_folder() -> None:
    provider = yaml.safe_load(render_all()[DASHBOARD_PROVIDER_FILE])["providers"]
    assert len(provider) == 1
    assert provider[0]["type"] == "file"
    assert provider[0]["options"]["path"] == GRAFANA_DASHBOARDS_PATH
    for path, content in render_all().items():
        if path.endswith(".json"):
            assert Path(path).stem == json.loads(content)["uid"], "file name is the uid"


def test_render_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    """matplotlib is the optional ``render`` extra: dashboards/render.py imports without it
    (and without numpy), and drawing says what to install."""
    script = (
        "import sys\n"
        "sys.modules['matplotlib'] = sys.modules['numpy'] = None\n"
        "from dashboards.render import RenderUnavailable, legend_text, render_dashboards\n"
        "assert legend_text('{{engine}}', {'engine': '0'}, 'x') == '0'\n"
        "try:\n"
        "    render_dashboards('http://127.0.0.1:9', sys.argv[1])\n"
        "except RenderUnavailable as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'vllm-warden[render]'" in done.stdout
    assert not list(tmp_path.iterdir())
