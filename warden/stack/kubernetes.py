"""Kubernetes manifests for fleets that outgrow one machine (Prometheus Operator + Grafana).

Generated from the same objects as the single-machine stack, so nothing is restated:

- ``PrometheusRule``: the rule groups of alerts/generated/rules.yml, unchanged.
- ``PodMonitor``: scrapes every engine pod under ``alerts.config.ENGINE_JOB`` and sets
  ``instance`` to the pod name, the identity per-instance routing keys on.
- ``AlertmanagerConfig``: the routes and receivers of the generated Alertmanager config,
  translated to the CRD's spelling, with the engine route expanded into one route per engine
  pod (``instance="<pod>"`` -> that pod's webhook, reached through a headless Service).
  Alertmanager cannot template a webhook URL from labels; docs/kubernetes.md explains the
  choice.
- Grafana ``ConfigMap``s (label ``grafana_dashboard: "1"`` for the Grafana sidecar) holding the
  generated dashboard JSON byte for byte, and the datasource with the uid the panels use.
- The engine ``StatefulSet`` and its headless ``Service``: stable pod names for the routes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from alerts.alertmanager import ENGINE_RECEIVER, build_alertmanager_config
from alerts.config import ENGINE_JOB
from alerts.rules_file import rule_groups
from alerts.yamltext import dump_yaml
from dashboards.generate import dashboard_models, dashboard_path
from dashboards.generate import render_all as render_dashboards
from dashboards.provisioning import FOLDER_TITLE, datasource_config
from warden.stack.config import ENGINE_WEBHOOK_PATH
from warden.stack.webhook_token import TOKEN_FILE_ENV

OUTPUT_DIR = "deploy/kubernetes"
MONITORING_API = "monitoring.coreos.com/v1"
ALERTMANAGER_CONFIG_API = "monitoring.coreos.com/v1alpha1"
PART_OF = {"app.kubernetes.io/part-of": "vllm-warden"}
TOKEN_MOUNT_DIR = "/run/secrets/warden"


@dataclass(frozen=True)
class Fleet:
    """The deployment the manifests describe. ``replicas`` fixes the engine pods that get a
    webhook route: change it with the StatefulSet and regenerate (see docs/kubernetes.md)."""

    namespace: str = "vllm-warden"
    name: str = "vllm-warden"
    replicas: int = 2
    image: str = "vllm-warden:latest"
    model: str = "tiny"
    port: int = 8000
    port_name: str = "http"
    scrape_interval: str = "5s"
    token_secret: str = "warden-webhook-token"
    token_key: str = "token"
    pager_url: str = "http://warden-pager.vllm-warden.svc:9099/"
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    gpus_per_engine: int = 1
    extra_labels: dict[str, str] = field(default_factory=dict)

    @property
    def headless_service(self) -> str:
        return f"{self.name}-engines"

    @property
    def selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.name, "app.kubernetes.io/component": "engine"}

    def pod_names(self) -> list[str]:
        return [f"{self.name}-{index}" for index in range(self.replicas)]

    def webhook_url(self, pod: str) -> str:
        host = f"{pod}.{self.headless_service}.{self.namespace}.svc"
        return f"http://{host}:{self.port}{ENGINE_WEBHOOK_PATH}"

    def metadata(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": {**PART_OF, **self.extra_labels},
        }


def engine_receiver(pod: str) -> str:
    return f"{ENGINE_RECEIVER}-{pod}"


# --- Rules and scraping ---------------------------------------------------------------------
def prometheus_rule(fleet: Fleet) -> dict[str, Any]:
    return {
        "apiVersion": MONITORING_API,
        "kind": "PrometheusRule",
        "metadata": fleet.metadata(f"{fleet.name}-rules"),
        "spec": {"groups": rule_groups()},
    }


def pod_monitor(fleet: Fleet) -> dict[str, Any]:
    return {
        "apiVersion": MONITORING_API,
        "kind": "PodMonitor",
        "metadata": fleet.metadata(fleet.name),
        "spec": {
            "selector": {"matchLabels": fleet.selector},
            "podMetricsEndpoints": [
                {
                    "port": fleet.port_name,
                    "path": "/metrics",
                    "interval": fleet.scrape_interval,
                    "relabelings": [
                        # The pod name is the engine's identity in alerts and routes.
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_name"],
                            "targetLabel": "instance",
                        },
                        # The job the rules watch, whatever the operator would call it.
                        {"targetLabel": "job", "replacement": ENGINE_JOB},
                    ],
                }
            ],
        },
    }


# --- Alertmanager -----------------------------------------------------------------------------
_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')


def crd_matcher(text: str) -> dict[str, str]:
    """``name=~"value"`` -> ``{name, value, matchType}`` as the CRD wants matchers."""
    match = _MATCHER.match(text)
    if match is None:
        raise ValueError(f"cannot translate matcher {text!r}")
    name, match_type, value = match.groups()
    return {"name": name, "value": value, "matchType": match_type}


def _crd_route(route: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"receiver": route["receiver"]}
    if "matchers" in route:
        out["matchers"] = [crd_matcher(m) for m in route["matchers"]]
    if "group_by" in route:
        out["groupBy"] = list(route["group_by"])
    for key, crd_key in (
        ("group_wait", "groupWait"),
        ("group_interval", "groupInterval"),
        ("repeat_interval", "repeatInterval"),
        ("continue", "continue"),
    ):
        if key in route:
            out[crd_key] = route[key]
    return out


def _crd_webhook(config: dict[str, Any], fleet: Fleet, url: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"url": url or config["url"], "sendResolved": config["send_resolved"]}
    if "http_config" in config:
        out["httpConfig"] = {
            "authorization": {
                "type": config["http_config"]["authorization"]["type"],
                "credentials": {"name": fleet.token_secret, "key": fleet.token_key},
            }
        }
    return out


def alertmanager_config(fleet: Fleet) -> dict[str, Any]:
    """The generated Alertmanager config in CRD form, engine route fanned out per pod."""
    source = build_alertmanager_config(
        "http://engine.invalid" + ENGINE_WEBHOOK_PATH, "token-file", fleet.pager_url
    )
    routes: list[dict[str, Any]] = []
    for route in source["route"]["routes"]:
        if route["receiver"] != ENGINE_RECEIVER:
            routes.append(_crd_route(route))
            continue
        for pod in fleet.pod_names():
            per_pod = _crd_route(route)
            per_pod["receiver"] = engine_receiver(pod)
            per_pod["matchers"] = [
                *per_pod["matchers"],
                {"name": "instance", "value": pod, "matchType": "="},
            ]
            routes.append(per_pod)
    top = _crd_route({k: v for k, v in source["route"].items() if k != "routes"})
    top["routes"] = routes

    receivers: list[dict[str, Any]] = []
    for receiver in source["receivers"]:
        hooks = receiver.get("webhook_configs", [])
        if receiver["name"] == ENGINE_RECEIVER:
            for pod in fleet.pod_names():
                receivers.append(
                    {
                        "name": engine_receiver(pod),
                        "webhookConfigs": [
                            _crd_webhook(hook, fleet, fleet.webhook_url(pod)) for hook in hooks
                        ],
                    }
                )
            continue
        crd: dict[str, Any] = {"name": receiver["name"]}
        if hooks:
            crd["webhookConfigs"] = [_crd_webhook(hook, fleet) for hook in hooks]
        receivers.append(crd)

    inhibit = [
        {
            "sourceMatch": [crd_matcher(m) for m in rule["source_matchers"]],
            "targetMatch": [crd_matcher(m) for m in rule["target_matchers"]],
            "equal": list(rule["equal"]),
        }
        for rule in source["inhibit_rules"]
    ]
    return {
        "apiVersion": ALERTMANAGER_CONFIG_API,
        "kind": "AlertmanagerConfig",
        "metadata": fleet.metadata(fleet.name),
        "spec": {"route": top, "receivers": receivers, "inhibitRules": inhibit},
    }


# --- Grafana ----------------------------------------------------------------------------------
def dashboard_config_maps(fleet: Fleet) -> list[dict[str, Any]]:
    """One ConfigMap per dashboard, its JSON exactly as dashboards/generated has it."""
    files = render_dashboards()
    maps = []
    for uid in dashboard_models():
        meta = fleet.metadata(f"{fleet.name}-dashboard-{uid}")
        meta["labels"]["grafana_dashboard"] = "1"
        meta["annotations"] = {"grafana_folder": FOLDER_TITLE}
        maps.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": meta,
                "data": {f"{uid}.json": files[dashboard_path(uid)]},
            }
        )
    return maps


def datasource_config_map(fleet: Fleet) -> dict[str, Any]:
    """The Prometheus datasource with the uid every panel references (sidecar label)."""
    meta = fleet.metadata(f"{fleet.name}-datasource")
    meta["labels"]["grafana_datasource"] = "1"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {"warden-datasource.yaml": dump_yaml(datasource_config(fleet.prometheus_url))},
    }


# --- The engines ------------------------------------------------------------------------------
def engine_service(fleet: Fleet) -> dict[str, Any]:
    """Headless: gives each engine pod the DNS name its webhook route uses."""
    meta = fleet.metadata(fleet.headless_service)
    meta["labels"].update(fleet.selector)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": fleet.selector,
            "ports": [{"name": fleet.port_name, "port": fleet.port, "targetPort": fleet.port_name}],
        },
    }


def engine_stateful_set(fleet: Fleet) -> dict[str, Any]:
    """Engines with stable names (``<name>-0``, ...), image built from compose/Dockerfile."""
    meta = fleet.metadata(fleet.name)
    meta["labels"].update(fleet.selector)
    token_path = f"{TOKEN_MOUNT_DIR}/{fleet.token_key}"
    container: dict[str, Any] = {
        "name": "engine",
        "image": fleet.image,
        "args": ["python", "-m", "warden.stack.container"],
        "env": [
            {"name": "WARDEN_MODEL", "value": fleet.model},
            {"name": "WARDEN_PORT", "value": str(fleet.port)},
            {"name": TOKEN_FILE_ENV, "value": token_path},
        ],
        "ports": [{"name": fleet.port_name, "containerPort": fleet.port}],
        # Model loading can take many minutes: the startup probe holds the other two off
        # until vLLM answers /health, so a loading model is never killed.
        "startupProbe": {
            "httpGet": {"path": "/health", "port": fleet.port_name},
            "periodSeconds": 10,
            "failureThreshold": 90,
        },
        # Ready = warden's checks: not stalled, watermark below oom_imminent, breaker closed.
        "readinessProbe": {
            "httpGet": {"path": "/warden/ready", "port": fleet.port_name},
            "periodSeconds": 5,
        },
        "livenessProbe": {
            "httpGet": {"path": "/warden/live", "port": fleet.port_name},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "volumeMounts": [
            {"name": "webhook-token", "mountPath": TOKEN_MOUNT_DIR, "readOnly": True},
            {"name": "data", "mountPath": "/data"},
        ],
    }
    if fleet.gpus_per_engine:
        container["resources"] = {"limits": {"nvidia.com/gpu": fleet.gpus_per_engine}}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "serviceName": fleet.headless_service,
            "replicas": fleet.replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": fleet.selector},
            "template": {
                "metadata": {"labels": {**PART_OF, **fleet.selector}},
                "spec": {
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "webhook-token",
                            "secret": {"secretName": fleet.token_secret, "defaultMode": 0o400},
                        },
                        {"name": "data", "emptyDir": {}},
                    ],
                },
            },
        },
    }


# --- Files ------------------------------------------------------------------------------------
HEADER_COMMENT = (
    "# Generated by `warden generate` from warden/stack/kubernetes.py: do not edit.\n"
    "# See docs/kubernetes.md.\n"
)


def _documents(*docs: dict[str, Any]) -> str:
    return HEADER_COMMENT + "---\n".join(dump_yaml(doc) for doc in docs)


def render_manifests(fleet: Fleet = Fleet()) -> dict[str, str]:
    """Repo-relative path -> manifest text; kustomization.yaml lists them all."""
    files = {
        "engine.yaml": _documents(engine_service(fleet), engine_stateful_set(fleet)),
        "podmonitor.yaml": _documents(pod_monitor(fleet)),
        "prometheusrule.yaml": _documents(prometheus_rule(fleet)),
        "alertmanagerconfig.yaml": _documents(alertmanager_config(fleet)),
        "grafana-dashboards.yaml": _documents(*dashboard_config_maps(fleet)),
        "grafana-datasource.yaml": _documents(datasource_config_map(fleet)),
    }
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": fleet.namespace,
        "resources": sorted(files),
    }
    files["kustomization.yaml"] = HEADER_COMMENT + dump_yaml(kustomization)
    return {f"{OUTPUT_DIR}/{name}": text for name, text in files.items()}
