"""Kubernetes manifests: rules and dashboards identical to the single-machine files, routes
equivalent to the generated Alertmanager config with one engine route per pod."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.alertmanager import ENGINE_RECEIVER, build_alertmanager_config
from alerts.config import ENGINE_JOB
from dashboards.datasource import DATASOURCE_UID
from warden.stack.config import ENGINE_WEBHOOK_PATH, REPO_RULES_PATH
from warden.stack.kubernetes import (
    OUTPUT_DIR,
    Fleet,
    alertmanager_config,
    crd_matcher,
    engine_receiver,
    render_manifests,
)

REPO = Path(__file__).resolve().parent.parent
MANIFESTS = REPO / OUTPUT_DIR


def documents(name: str) -> list[dict[str, Any]]:
    """The committed manifest file's documents (so the test reads what users apply)."""
    return [doc for doc in yaml.safe_load_all((MANIFESTS / name).read_text()) if doc]


def one(name: str, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in documents(name) if d["kind"] == kind]
    return doc


def test_committed_manifests_are_up_to_date() -> None:
    for relative, content in render_manifests().items():
        path = REPO / relative
        assert path.exists() and path.read_text() == content, f"{relative}: run `warden generate`"


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = documents("kustomization.yaml")
    on_disk = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk


def test_prometheus_rule_groups_equal_the_rules_file() -> None:
    rule = one("prometheusrule.yaml", "PrometheusRule")
    rules_file = yaml.safe_load((REPO / REPO_RULES_PATH).read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == rules_file["groups"]


def test_dashboard_config_maps_hold_the_generated_json_byte_for_byte() -> None:
    maps = [d for d in documents("grafana-dashboards.yaml") if d["kind"] == "ConfigMap"]
    generated = {p.name: p.read_text() for p in (REPO / "dashboards" / "generated").glob("*.json")}
    seen = {}
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        seen.update(config_map["data"])
    assert seen == generated
    for text in seen.values():
        json.loads(text)


def test_datasource_config_map_has_the_uid_panels_use() -> None:
    config_map = one("grafana-datasource.yaml", "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_datasource"] == "1"
    (text,) = config_map["data"].values()
    assert yaml.safe_load(text)["datasources"][0]["uid"] == DATASOURCE_UID


def test_pod_monitor_scrapes_engine_pods_as_the_engine_job_with_pod_instances() -> None:
    monitor = one("podmonitor.yaml", "PodMonitor")
    stateful = one("engine.yaml", "StatefulSet")
    selector = monitor["spec"]["selector"]["matchLabels"]
    pod_labels = stateful["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    container = stateful["spec"]["template"]["spec"]["containers"][0]
    assert endpoint["port"] in {p["name"] for p in container["ports"]}
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert relabel["job"]["replacement"] == ENGINE_JOB
    assert relabel["instance"]["sourceLabels"] == ["__meta_kubernetes_pod_name"]


def test_engine_pods_get_stable_dns_names_for_their_webhook_routes() -> None:
    fleet = Fleet()
    service = one("engine.yaml", "Service")
    stateful = one("engine.yaml", "StatefulSet")
    assert service["spec"]["clusterIP"] == "None"
    assert stateful["spec"]["serviceName"] == service["metadata"]["name"]
    assert stateful["spec"]["replicas"] == fleet.replicas
    url = fleet.webhook_url(fleet.pod_names()[0])
    assert url == (
        f"http://{fleet.name}-0.{service['metadata']['name']}.{fleet.namespace}.svc:"
        f"{fleet.port}{ENGINE_WEBHOOK_PATH}"
    )


def _native_matchers(matchers: list[dict[str, str]]) -> list[str]:
    return [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in matchers]


def _native_route(route: dict[str, Any]) -> dict[str, Any]:
    """A CRD route spelled back the way alertmanager.yml spells it."""
    out: dict[str, Any] = {"receiver": route["receiver"]}
    if "matchers" in route:
        out["matchers"] = _native_matchers(route["matchers"])
    names = {
        "groupBy": "group_by",
        "groupWait": "group_wait",
        "groupInterval": "group_interval",
        "repeatInterval": "repeat_interval",
        "continue": "continue",
    }
    for key, native in names.items():
        if key in route:
            out[native] = route[key]
    return out


def test_alertmanager_config_routes_are_the_generated_routes_with_engines_per_pod() -> None:
    fleet = Fleet(replicas=3)
    crd = alertmanager_config(fleet)["spec"]
    source = build_alertmanager_config("http://e/", "token", fleet.pager_url)
    pods = fleet.pod_names()

    expected_routes = []
    for route in source["route"]["routes"]:
        if route["receiver"] != ENGINE_RECEIVER:
            expected_routes.append(route)
            continue
        for pod in pods:
            per_pod = dict(route, receiver=engine_receiver(pod))
            per_pod["matchers"] = [*route["matchers"], f'instance="{pod}"']
            expected_routes.append(per_pod)
    assert [_native_route(r) for r in crd["route"]["routes"]] == expected_routes
    top = {k: v for k, v in source["route"].items() if k != "routes"}
    assert _native_route({k: v for k, v in crd["route"].items() if k != "routes"}) == top


def test_alertmanager_config_receivers_and_inhibition_match_the_generated_config() -> None:
    fleet = Fleet(replicas=2)
    crd = alertmanager_config(fleet)["spec"]
    source = build_alertmanager_config("http://e/", "token", fleet.pager_url)
    receivers = {r["name"]: r for r in crd["receivers"]}
    for receiver in source["receivers"]:
        if receiver["name"] == ENGINE_RECEIVER:
            for pod in fleet.pod_names():
                (hook,) = receivers[engine_receiver(pod)]["webhookConfigs"]
                assert hook["url"] == fleet.webhook_url(pod)
                assert hook["sendResolved"] is True
                auth = hook["httpConfig"]["authorization"]
                assert auth["type"] == "Bearer"
                assert auth["credentials"] == {"name": fleet.token_secret, "key": fleet.token_key}
            continue
        hooks = receivers[receiver["name"]].get("webhookConfigs", [])
        assert [(h["url"], h["sendResolved"]) for h in hooks] == [
            (h["url"], h["send_resolved"]) for h in receiver.get("webhook_configs", [])
        ]
    (inhibit,) = crd["inhibitRules"]
    (native,) = source["inhibit_rules"]
    assert _native_matchers(inhibit["sourceMatch"]) == native["source_matchers"]
    assert _native_matchers(inhibit["targetMatch"]) == native["target_matchers"]
    assert inhibit["equal"] == native["equal"]


def test_every_engine_pod_has_a_route_and_the_stateful_set_has_that_many() -> None:
    crd = one("alertmanagerconfig.yaml", "AlertmanagerConfig")
    stateful = one("engine.yaml", "StatefulSet")
    names = {r["name"] for r in crd["spec"]["receivers"]}
    for index in range(stateful["spec"]["replicas"]):
        assert engine_receiver(f"{stateful['metadata']['name']}-{index}") in names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('warden_action=~".+"', {"name": "warden_action", "value": ".+", "matchType": "=~"}),
        ('severity="critical"', {"name": "severity", "value": "critical", "matchType": "="}),
        ('a!="b"', {"name": "a", "value": "b", "matchType": "!="}),
    ],
)
def test_matcher_translation(text: str, expected: dict[str, str]) -> None:
    assert crd_matcher(text) == expected


def test_matcher_translation_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError):
        crd_matcher("severity critical")
