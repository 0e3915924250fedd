"""Kubernetes manifests: rules and dashboards identical to the single-machine files, routes
equivalent to the generated Alertmanager config with warden relay as the engine receiver, every
custom resource valid against the Prometheus Operator's CRD schemas (tests/data/
prometheus-operator), pods non-root with a readable token, ingress closed by NetworkPolicy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.alertmanager import ENGINE_RECEIVER, build_alertmanager_config
from alerts.config import ENGINE_JOB, RELAY_JOB
from dashboards.datasource import DATASOURCE_UID
from tests.support.crd_schema import crd_errors, has_schema
from warden.stack.config import ENGINE_WEBHOOK_PATH, REPO_RULES_PATH
from warden.stack.kubernetes import (
    IMAGE_UID,
    OUTPUT_DIR,
    Fleet,
    alertmanager_config,
    crd_matcher,
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


def test_datasource_is_not_marked_default() -> None:
    (text,) = one("grafana-datasource.yaml", "ConfigMap")["data"].values()
    assert [d["isDefault"] for d in yaml.safe_load(text)["datasources"]] == [False]


def all_documents() -> list[dict[str, Any]]:
    return [doc for path in sorted(MANIFESTS.glob("*.yaml")) for doc in documents(path.name)]


def test_every_custom_resource_is_valid_against_the_operator_crd_schemas() -> None:
    custom = [d for d in all_documents() if d["apiVersion"].startswith("monitoring.coreos.com/")]
    kinds = {d["kind"] for d in custom}
    assert kinds == {"PrometheusRule", "PodMonitor", "AlertmanagerConfig"}
    for doc in custom:
        assert has_schema(doc)
        assert crd_errors(doc) == [], f"{doc['kind']} {doc['metadata']['name']}"


@pytest.mark.parametrize(
    ("kind", "path", "bad_value"),
    [
        # What the schema check must catch: an unknown field, a wrong type, a bad enum value.
        ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "relabelings", 0, "target"), "x"),
        ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "for"), 5),
        ("AlertmanagerConfig", ("spec", "inhibitRules", 0, "sourceMatch", 0, "matchType"), "=="),
    ],
)
def test_the_crd_schema_check_refuses_broken_resources(
    kind: str, path: tuple[Any, ...], bad_value: Any
) -> None:
    doc = next(d for d in all_documents() if d["kind"] == kind)
    node: Any = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = bad_value
    assert crd_errors(doc), f"{kind}: {path} = {bad_value!r} passed the schema"


def test_pod_monitors_scrape_engines_and_relay_under_their_jobs_with_pod_instances() -> None:
    monitors = {m["metadata"]["name"]: m for m in documents("podmonitor.yaml")}
    fleet = Fleet()
    pods = {
        fleet.name: (one("engine.yaml", "StatefulSet"), ENGINE_JOB),
        fleet.relay_name: (one("relay.yaml", "Deployment"), RELAY_JOB),
    }
    assert set(monitors) == set(pods)
    for name, (workload, job) in pods.items():
        monitor = monitors[name]
        selector = monitor["spec"]["selector"]["matchLabels"]
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        container = workload["spec"]["template"]["spec"]["containers"][0]
        assert endpoint["port"] in {p["name"] for p in container["ports"]}
        relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
        assert relabel["job"]["replacement"] == job
        assert relabel["instance"]["sourceLabels"] == ["__meta_kubernetes_pod_name"]


def test_engine_pods_know_their_identity_from_the_downward_api() -> None:
    (container,) = one("engine.yaml", "StatefulSet")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    # The same name the PodMonitor gives the pod as ``instance``; namespace kept in identity.
    assert env["WARDEN_INSTANCE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["WARDEN_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_every_pod_runs_non_root_and_can_read_the_mounted_token() -> None:
    workloads = [one("engine.yaml", "StatefulSet"), one("relay.yaml", "Deployment")]
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == IMAGE_UID != 0
        # The Secret's files belong to group fsGroup with mode 0440: the user can read them.
        assert security["fsGroup"] == security["runAsGroup"] == IMAGE_UID
        (token,) = [v for v in pod["volumes"] if "secret" in v]
        mode = token["secret"]["defaultMode"]
        assert mode & 0o040 and not mode & 0o007, oct(mode)
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
            env = {e["name"]: e.get("value") for e in container["env"]}
            (mount,) = [m for m in container["volumeMounts"] if m["name"] == token["name"]]
            assert env["WARDEN_WEBHOOK_TOKEN_FILE"].startswith(mount["mountPath"] + "/")


def _peers(policy: dict[str, Any]) -> list[tuple[dict[str, Any], list[Any]]]:
    return [
        (peer, [p["port"] for p in rule["ports"]])
        for rule in policy["spec"]["ingress"]
        for peer in rule["from"]
    ]


def test_network_policies_admit_only_the_peers_each_port_needs() -> None:
    fleet = Fleet()
    policies = {p["metadata"]["name"]: p for p in documents("networkpolicy.yaml")}
    engine, relay = policies[fleet.name], policies[fleet.relay_name]
    assert engine["spec"]["podSelector"]["matchLabels"] == fleet.selector
    assert relay["spec"]["podSelector"]["matchLabels"] == fleet.relay_selector
    for policy in (engine, relay):
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    monitoring = {"kubernetes.io/metadata.name": fleet.monitoring_namespace}

    def operator(name: str) -> dict[str, Any]:
        return {
            "namespaceSelector": {"matchLabels": monitoring},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": name}},
        }

    # The relay: Alertmanager's notifications and Prometheus's scrapes, nobody else.
    assert _peers(relay) == [
        (operator("alertmanager"), ["relay"]),
        (operator("prometheus"), ["relay"]),
    ]
    # The engines: the relay (webhook), Prometheus, and the declared clients; never all
    # namespaces (an empty namespaceSelector) and no other port.
    engine_peers = _peers(engine)
    assert ({"podSelector": {"matchLabels": fleet.relay_selector}}, ["http"]) in engine_peers
    assert (operator("prometheus"), ["http"]) in engine_peers
    assert all(ports == [fleet.port_name] for _, ports in engine_peers)
    assert all(peer.get("namespaceSelector", {"x": 1}) != {} for peer, _ in engine_peers)


def test_alertmanager_sends_engine_alerts_to_the_relay_whatever_the_replica_count() -> None:
    small, large = Fleet(replicas=3), Fleet(replicas=500)
    assert alertmanager_config(small) == alertmanager_config(large)
    crd = one("alertmanagerconfig.yaml", "AlertmanagerConfig")["spec"]
    (engine,) = [r for r in crd["receivers"] if r["name"] == ENGINE_RECEIVER]
    (hook,) = engine["webhookConfigs"]
    fleet = Fleet()
    assert hook["url"] == (
        f"http://{fleet.relay_name}.{fleet.namespace}.svc:{fleet.relay_port}{ENGINE_WEBHOOK_PATH}"
    )
    service = one("relay.yaml", "Service")
    assert service["metadata"]["name"] == fleet.relay_name
    assert service["spec"]["ports"][0]["port"] == fleet.relay_port


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


def test_alertmanager_config_routes_are_the_generated_routes() -> None:
    fleet = Fleet()
    crd = alertmanager_config(fleet)["spec"]
    source = build_alertmanager_config(fleet.relay_webhook_url(), "token", fleet.pager_url)
    assert [_native_route(r) for r in crd["route"]["routes"]] == source["route"]["routes"]
    top = {k: v for k, v in source["route"].items() if k != "routes"}
    assert _native_route({k: v for k, v in crd["route"].items() if k != "routes"}) == top


def test_alertmanager_config_receivers_and_inhibition_match_the_generated_config() -> None:
    fleet = Fleet()
    crd = alertmanager_config(fleet)["spec"]
    source = build_alertmanager_config(fleet.relay_webhook_url(), "token", fleet.pager_url)
    receivers = {r["name"]: r for r in crd["receivers"]}
    assert set(receivers) == {r["name"] for r in source["receivers"]}
    for receiver in source["receivers"]:
        hooks = receivers[receiver["name"]].get("webhookConfigs", [])
        assert [(h["url"], h["sendResolved"]) for h in hooks] == [
            (h["url"], h["send_resolved"]) for h in receiver.get("webhook_configs", [])
        ]
        for hook, native in zip(hooks, receiver.get("webhook_configs", []), strict=True):
            if "http_config" in native:
                auth = hook["httpConfig"]["authorization"]
                assert auth["type"] == "Bearer"
                assert auth["credentials"] == {"name": fleet.token_secret, "key": fleet.token_key}
    assert receivers[ENGINE_RECEIVER]["webhookConfigs"][0]["httpConfig"]
    assert [len(r["equal"]) for r in crd["inhibitRules"]] == [
        len(r["equal"]) for r in source["inhibit_rules"]
    ]
    for inhibit, native in zip(crd["inhibitRules"], source["inhibit_rules"], strict=True):
        assert _native_matchers(inhibit["sourceMatch"]) == native["source_matchers"]
        assert _native_matchers(inhibit["targetMatch"]) == native["target_matchers"]
        assert inhibit["equal"] == native["equal"]


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


# --- The engine's probes: one account in the manifest and both docs ---------------------------

DOCS = (REPO / "docs" / "kubernetes.md", REPO / "docs" / "supervisor.md")


def _engine_container() -> dict[str, Any]:
    stateful_set = one("engine.yaml", "StatefulSet")
    (container,) = stateful_set["spec"]["template"]["spec"]["containers"]
    return dict(container)


def probe_rows() -> dict[str, str]:
    """Each probe of the committed manifest as the docs' table starts its row."""
    container = _engine_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    rows = {}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        rows[probe] = f"| `{probe}` | `GET {get['path']}` on `{get['port']}` ({ports[get['port']]})"
    return rows


def test_liveness_asks_the_supervisor_and_readiness_the_engine() -> None:
    """The supervisor restarts vLLM in the container; liveness must stay green through those
    restarts and readiness must fail while the engine is dead or hung."""
    container = _engine_container()
    env = {e["name"]: e.get("value") for e in container["env"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["args"] == ["python", "-m", "warden.stack.container"]
    live = container["livenessProbe"]["httpGet"]
    assert live == {"path": "/supervisor/live", "port": "supervisor"}
    assert str(ports["supervisor"]) == env["WARDEN_SUPERVISOR_PORT"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/warden/ready", "port": "http"}
    assert str(ports["http"]) == env["WARDEN_PORT"]
    template = one("engine.yaml", "StatefulSet")["spec"]["template"]
    # The stop signal drains: the grace covers the drain and vLLM's stop.
    assert template["spec"]["terminationGracePeriodSeconds"] >= 150
    assert "liveness: the supervisor" in template["metadata"]["annotations"]["vllm-warden/probes"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_docs_give_the_manifests_probes(doc: Path) -> None:
    text = doc.read_text()
    for probe, row in probe_rows().items():
        assert row in text, f"{doc.name}: the {probe} row must read {row!r}"
    advice = [line for line in text.splitlines() if "livenessProbe" in line or "liveness:" in line]
    assert advice and all("/supervisor/live" in line for line in advice), advice
