"""Kubernetes manifests for fleets that outgrow one machine (Prometheus Operator + Grafana).

Generated from the same objects as the single-machine stack, so nothing is restated:

- ``PrometheusRule``: the rule groups of alerts/generated/rules.yml, unchanged.
- ``PodMonitor``s: the engine pods under ``alerts.config.ENGINE_JOB`` with ``instance`` set to
  the pod name (the operator adds ``namespace``), and warden relay under ``RELAY_JOB``.
- ``AlertmanagerConfig``: the routes and receivers of the generated Alertmanager config in the
  CRD's spelling; the engine receiver is warden relay, which forwards each alert to the pod its
  labels name (found in Prometheus's targets), so nothing here depends on the replica count.
- Grafana ``ConfigMap``s (label ``grafana_dashboard: "1"`` for the Grafana sidecar) holding the
  generated dashboard JSON byte for byte, and the datasource with the uid the panels use (not
  marked default: a cluster's Grafana usually has its own default).
- The engine ``StatefulSet`` (identity from the downward API) and its headless ``Service``,
  warden relay's ``Deployment`` and ``Service``, and ``NetworkPolicy``s closing both to
  everything but the peers that need them. Every pod runs as the image's non-root user; the
  token Secret is group-readable through ``fsGroup``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from alerts.alertmanager import build_alertmanager_config
from alerts.config import ENGINE_JOB, RELAY_JOB
from alerts.rules_file import rule_groups
from alerts.yamltext import dump_yaml
from dashboards.generate import dashboard_models, dashboard_path
from dashboards.generate import render_all as render_dashboards
from dashboards.provisioning import FOLDER_TITLE, datasource_config
from warden.relay.cli import DEFAULT_PORT as RELAY_PORT
from warden.stack.config import ENGINE_WEBHOOK_PATH
from warden.stack.webhook_token import TOKEN_FILE_ENV
from warden.supervisor.config import SupervisorConfig

OUTPUT_DIR = "deploy/kubernetes"
MONITORING_API = "monitoring.coreos.com/v1"
ALERTMANAGER_CONFIG_API = "monitoring.coreos.com/v1alpha1"
PART_OF = {"app.kubernetes.io/part-of": "vllm-warden"}
TOKEN_MOUNT_DIR = "/run/secrets/warden"
# The image's user (compose/Dockerfile: useradd --uid 10001 warden).
IMAGE_UID = 10001
# Labels the Prometheus Operator puts on the pods it runs.
OPERATOR_POD_NAME_LABEL = "app.kubernetes.io/name"
# Kubernetes labels every namespace with its name (1.21+).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Fleet:
    """The deployment the manifests describe. ``replicas`` only sizes the StatefulSet: alerts
    reach pods through warden relay, so scaling needs no other change (docs/kubernetes.md).

    ``monitoring_namespace``: where the operator runs Prometheus and Alertmanager (their pods
    alone may reach the relay and scrape the engines). ``client_namespace_labels``: namespaces
    whose pods may send requests to the engines (besides pods of the fleet's own namespace)."""

    namespace: str = "vllm-warden"
    name: str = "vllm-warden"
    replicas: int = 2
    image: str = "vllm-warden:latest"
    model: str = "tiny"
    port: int = 8000
    port_name: str = "http"
    supervisor_port: int = 8001
    supervisor_port_name: str = "supervisor"
    relay_port: int = RELAY_PORT
    scrape_interval: str = "5s"
    token_secret: str = "warden-webhook-token"
    token_key: str = "token"
    pager_url: str = "http://warden-pager.vllm-warden.svc:9099/"
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    monitoring_namespace: str = "monitoring"
    client_namespace_labels: dict[str, str] = field(
        default_factory=lambda: {"vllm-warden/clients": "true"}
    )
    gpus_per_engine: int = 1
    extra_labels: dict[str, str] = field(default_factory=dict)

    @property
    def headless_service(self) -> str:
        return f"{self.name}-engines"

    @property
    def relay_name(self) -> str:
        return f"{self.name}-relay"

    @property
    def selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.name, "app.kubernetes.io/component": "engine"}

    @property
    def relay_selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.name, "app.kubernetes.io/component": "relay"}

    def relay_webhook_url(self) -> str:
        host = f"{self.relay_name}.{self.namespace}.svc"
        return f"http://{host}:{self.relay_port}{ENGINE_WEBHOOK_PATH}"

    def metadata(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": {**PART_OF, **self.extra_labels},
        }


# --- Rules and scraping ---------------------------------------------------------------------
def prometheus_rule(fleet: Fleet) -> dict[str, Any]:
    return {
        "apiVersion": MONITORING_API,
        "kind": "PrometheusRule",
        "metadata": fleet.metadata(f"{fleet.name}-rules"),
        "spec": {"groups": rule_groups()},
    }


def _pod_monitor(
    fleet: Fleet, name: str, selector: dict[str, str], port: str, job: str
) -> dict[str, Any]:
    return {
        "apiVersion": MONITORING_API,
        "kind": "PodMonitor",
        "metadata": fleet.metadata(name),
        "spec": {
            "selector": {"matchLabels": selector},
            "podMetricsEndpoints": [
                {
                    "port": port,
                    "path": "/metrics",
                    "interval": fleet.scrape_interval,
                    "relabelings": [
                        # The pod name is the engine's identity in alerts (with the namespace
                        # label the operator adds), and what WARDEN_INSTANCE says in the pod.
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_name"],
                            "targetLabel": "instance",
                        },
                        # The job the rules watch, whatever the operator would call it.
                        {"targetLabel": "job", "replacement": job},
                    ],
                }
            ],
        },
    }


def pod_monitor(fleet: Fleet) -> dict[str, Any]:
    return _pod_monitor(fleet, fleet.name, fleet.selector, fleet.port_name, ENGINE_JOB)


def relay_pod_monitor(fleet: Fleet) -> dict[str, Any]:
    """warden relay's own metrics: the delivery alerts watch them."""
    return _pod_monitor(fleet, fleet.relay_name, fleet.relay_selector, "relay", RELAY_JOB)


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


def _crd_webhook(config: dict[str, Any], fleet: Fleet) -> dict[str, Any]:
    out: dict[str, Any] = {"url": config["url"], "sendResolved": config["send_resolved"]}
    if "http_config" in config:
        out["httpConfig"] = {
            "authorization": {
                "type": config["http_config"]["authorization"]["type"],
                "credentials": {"name": fleet.token_secret, "key": fleet.token_key},
            }
        }
    return out


def alertmanager_config(fleet: Fleet) -> dict[str, Any]:
    """The generated Alertmanager config in CRD form; the engine receiver is warden relay."""
    source = build_alertmanager_config(fleet.relay_webhook_url(), "token-file", fleet.pager_url)
    top = _crd_route({k: v for k, v in source["route"].items() if k != "routes"})
    top["routes"] = [_crd_route(route) for route in source["route"]["routes"]]
    receivers: list[dict[str, Any]] = []
    for receiver in source["receivers"]:
        crd: dict[str, Any] = {"name": receiver["name"]}
        hooks = receiver.get("webhook_configs", [])
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
    """The Prometheus datasource with the uid every panel references (sidecar label), not
    marked default: two defaults make Grafana's sidecar provisioning fail."""
    meta = fleet.metadata(f"{fleet.name}-datasource")
    meta["labels"]["grafana_datasource"] = "1"
    config = datasource_config(fleet.prometheus_url)
    for source in config["datasources"]:
        source["isDefault"] = False  # the cluster's Grafana keeps its own default
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {"warden-datasource.yaml": dump_yaml(config)},
    }


# --- The engines and the relay -----------------------------------------------------------------
def pod_security_context() -> dict[str, Any]:
    """Non-root as the image's user; ``fsGroup`` makes the mounted token Secret (mode 0440)
    readable by it (without it the Secret is root's and every notification gets 403)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_UID,
        "fsGroup": IMAGE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(read_only_root: bool) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only_root,
    }


def _token_volume(fleet: Fleet) -> dict[str, Any]:
    return {
        "name": "webhook-token",
        "secret": {"secretName": fleet.token_secret, "defaultMode": 0o440},
    }


def _token_env(fleet: Fleet) -> dict[str, str]:
    return {"name": TOKEN_FILE_ENV, "value": f"{TOKEN_MOUNT_DIR}/{fleet.token_key}"}


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def engine_service(fleet: Fleet) -> dict[str, Any]:
    """Headless: the StatefulSet's governing Service (stable pod names = stable identities)."""
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


def engine_probes(fleet: Fleet) -> dict[str, Any]:
    """The engine container's probes (docs/kubernetes.md, "Probes", says why each is so).

    warden's supervisor runs in the container and restarts vLLM itself (crash, stall, hang,
    eager switch, under its restart circuit), so liveness asks the supervisor, which answers
    through every engine restart; it fails only when the supervisor itself does not answer.
    Readiness is the engine's: false while it is dead, stalled, hung, restarting, draining or
    at oom_imminent, so the pod leaves the Service until the supervisor has it serving again.
    The startup probe covers the first model load, which can take many minutes.
    """
    ready = {"path": "/warden/ready", "port": fleet.port_name}
    return {
        "startupProbe": {
            "httpGet": {"path": "/health", "port": fleet.port_name},
            "periodSeconds": 10,
            "failureThreshold": 90,
        },
        "readinessProbe": {
            "httpGet": ready,
            "periodSeconds": 5,
            "timeoutSeconds": 4,  # /warden/ready waits up to 3 s on the engine
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/supervisor/live", "port": fleet.supervisor_port_name},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
    }


# What the manifest says about its probes (the pod template's annotation), as the docs do.
PROBES_NOTE = (
    "liveness: the supervisor's port, which answers through engine restarts (the supervisor "
    "restarts a dead or hung vLLM in the container within seconds); readiness: the engine's "
    "/warden/ready (false while dead, stalled, hung, restarting or draining); startup: the "
    "first model load. See docs/kubernetes.md, Probes."
)
PROBES_ANNOTATION = "vllm-warden/probes"
# The stop signal drains: the drain timeout, vLLM's stop timeout, and a margin.
TERMINATION_GRACE_S = int(
    SupervisorConfig().drain_timeout_s + SupervisorConfig().stop_timeout_s + 30
)


def engine_stateful_set(fleet: Fleet) -> dict[str, Any]:
    """Engines with stable names (``<name>-0``, ...), image built from compose/Dockerfile."""
    meta = fleet.metadata(fleet.name)
    meta["labels"].update(fleet.selector)
    container: dict[str, Any] = {
        "name": "engine",
        "image": fleet.image,
        "args": ["python", "-m", "warden.stack.container"],
        "env": [
            {"name": "WARDEN_MODEL", "value": fleet.model},
            {"name": "WARDEN_PORT", "value": str(fleet.port)},
            {"name": "WARDEN_SUPERVISOR_PORT", "value": str(fleet.supervisor_port)},
            _token_env(fleet),
            # Identity (downward API): what the PodMonitor calls this pod in alerts.
            _field_env("WARDEN_INSTANCE", "metadata.name"),
            _field_env("WARDEN_NAMESPACE", "metadata.namespace"),
        ],
        "ports": [
            {"name": fleet.port_name, "containerPort": fleet.port},
            {"name": fleet.supervisor_port_name, "containerPort": fleet.supervisor_port},
        ],
        **engine_probes(fleet),
        "securityContext": container_security_context(read_only_root=False),
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
                "metadata": {
                    "labels": {**PART_OF, **fleet.selector},
                    "annotations": {PROBES_ANNOTATION: PROBES_NOTE},
                },
                "spec": {
                    "securityContext": pod_security_context(),
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
                    "containers": [container],
                    "volumes": [_token_volume(fleet), {"name": "data", "emptyDir": {}}],
                },
            },
        },
    }


def relay_deployment(fleet: Fleet) -> dict[str, Any]:
    """warden relay: Alertmanager's one engine receiver; finds pods in Prometheus's targets."""
    meta = fleet.metadata(fleet.relay_name)
    meta["labels"].update(fleet.relay_selector)
    container = {
        "name": "relay",
        "image": fleet.image,
        "args": ["python", "-m", "warden.cli", "relay", "--host", "0.0.0.0"]
        + ["--port", str(fleet.relay_port), "--prometheus", fleet.prometheus_url],
        "env": [_token_env(fleet)],
        "ports": [{"name": "relay", "containerPort": fleet.relay_port}],
        # Ready once it can read Prometheus's target list.
        "readinessProbe": {"httpGet": {"path": "/-/ready", "port": "relay"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/-/healthy", "port": "relay"}, "periodSeconds": 10},
        "securityContext": container_security_context(read_only_root=True),
        "volumeMounts": [{"name": "webhook-token", "mountPath": TOKEN_MOUNT_DIR, "readOnly": True}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": fleet.relay_selector},
            "template": {
                "metadata": {"labels": {**PART_OF, **fleet.relay_selector}},
                "spec": {
                    "securityContext": pod_security_context(),
                    "containers": [container],
                    "volumes": [_token_volume(fleet)],
                },
            },
        },
    }


def relay_service(fleet: Fleet) -> dict[str, Any]:
    meta = fleet.metadata(fleet.relay_name)
    meta["labels"].update(fleet.relay_selector)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "selector": fleet.relay_selector,
            "ports": [{"name": "relay", "port": fleet.relay_port, "targetPort": "relay"}],
        },
    }


# --- Network policies ---------------------------------------------------------------------------
def _operator_pods(fleet: Fleet, name: str) -> dict[str, Any]:
    """Pods of the operator's Prometheus or Alertmanager, in the monitoring namespace."""
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: fleet.monitoring_namespace}},
        "podSelector": {"matchLabels": {OPERATOR_POD_NAME_LABEL: name}},
    }


def _ingress(peers: list[dict[str, Any]], port: str) -> dict[str, Any]:
    return {"from": peers, "ports": [{"protocol": "TCP", "port": port}]}


def engine_network_policy(fleet: Fleet) -> dict[str, Any]:
    """Engine pods accept connections on their one port from warden relay (the webhook),
    Prometheus (/metrics) and the clients (same namespace, or namespaces labelled
    ``client_namespace_labels``); nothing else. The webhook shares the API port, so the
    policy cannot narrow it to the relay alone: its bearer token does (fails closed)."""
    relay: dict[str, Any] = {"podSelector": {"matchLabels": fleet.relay_selector}}
    clients: list[dict[str, Any]] = [
        {"podSelector": {}},
        {"namespaceSelector": {"matchLabels": dict(fleet.client_namespace_labels)}},
    ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": fleet.metadata(fleet.name),
        "spec": {
            "podSelector": {"matchLabels": fleet.selector},
            "policyTypes": ["Ingress"],
            "ingress": [
                _ingress([relay, _operator_pods(fleet, "prometheus")], fleet.port_name),
                _ingress(clients, fleet.port_name),
            ],
        },
    }


def relay_network_policy(fleet: Fleet) -> dict[str, Any]:
    """warden relay accepts notifications from Alertmanager and scrapes from Prometheus only."""
    peers = [_operator_pods(fleet, "alertmanager"), _operator_pods(fleet, "prometheus")]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": fleet.metadata(fleet.relay_name),
        "spec": {
            "podSelector": {"matchLabels": fleet.relay_selector},
            "policyTypes": ["Ingress"],
            "ingress": [_ingress(peers, "relay")],
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
        "relay.yaml": _documents(relay_service(fleet), relay_deployment(fleet)),
        "networkpolicy.yaml": _documents(engine_network_policy(fleet), relay_network_policy(fleet)),
        "podmonitor.yaml": _documents(pod_monitor(fleet), relay_pod_monitor(fleet)),
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
