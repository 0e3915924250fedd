"""A fleet for real (#12 item 3): two vLLM engines behind HAProxy, one Prometheus, one
Alertmanager whose only engine receiver is warden relay, and a pager.

Pressure on engine B (requests queueing on it, sent straight to it) fires an alert in
Prometheus from B's own metrics; Alertmanager calls the relay once; the relay hands the alert
to B alone, which stops admitting. Through the balancer every request is still answered, by A
(HAProxy retries B's 503 there). The fleet-wide alert pages once. When the pressure
ends, the resolved notification reaches B the same way and releases it.

The pressure alert is this test's own rule (``WardenFleetTestPressure``, built with the same
model and mixin config as warden's rules): the memory and saturation signals are being
redesigned, and this test is about the fleet, not about them. The fleet-wide alert is warden's
``WardenFleetDegraded``, its threshold lowered through the mixin config and its ``for``
shortened so the test takes minutes, not hours.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from alerts.alertmanager import RouteTiming, render_alertmanager_config
from alerts.config import DASHBOARD_FLEET, MixinConfig, Thresholds
from alerts.fleet import FLEET, FLEET_RECORDING
from alerts.model import AlertRule, RuleGroup
from alerts.recording import RECORDING_RULES
from alerts.yamltext import dump_yaml
from exporter import catalog
from tests.support.alertmanager import alertmanager_binary, running_alertmanager
from tests.support.engine import BASE_ARGS, sample, scrape
from tests.support.haproxy import SERVED_BY, haproxy_available, running_haproxy
from tests.support.prometheus import prometheus_available, running_prometheus
from warden.common.ports import free_port
from warden.common.processes import ChildProcess
from warden.common.waiting import wait_until
from warden.engine.launch import LaunchSpec
from warden.stack.pager import PagerServer
from warden.supervisor.engine import EngineProcess

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        not (prometheus_available() and alertmanager_binary() and haproxy_available()),
        reason="prometheus, prometheus-alertmanager and haproxy are needed",
    ),
]

TOKEN = "fleet-test-token-0123456789"
JOB = "vllm-fleet"
NAMESPACE = "fleet-test"
CLUSTER = "fleet-test-cluster"  # a Prometheus external label: on alerts, not on series
# Two engines: B, which the pressure degrades, and A, which must stay untouched and answer for
# both. A third engine proved nothing more and cost a start (about 35 s of CPU).
NAMES = ("a", "b")
OTHERS = ("a",)  # every engine but B
# The mixin config the rules, the Alertmanager config and the relay share.
CONFIG = MixinConfig(
    engine_selector=f'job="{JOB}"', thresholds=Thresholds(fleet_degraded_ratio=0.3)
)
# One request at a time per engine, so a handful sent at once queue; slowed steps so they last.
ENGINE_ARGS = (*BASE_ARGS, "--max-model-len", "256", "--max-num-seqs", "1")
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "WARDEN_TEST_STEP_DELAY_S": "0.03",
    "PYTHONUNBUFFERED": "1",
}
QUEUE_PRESSURE = 2  # requests waiting on one engine
PRESSURE_CLIENTS = 4
ENGINE_TIMING = RouteTiming("1s", "1s", "1m")
PAGER_TIMING = RouteTiming("1s", "2s", "1h")
PRESSURE = "WardenFleetTestPressure"
FLEET_ALERT = "WardenFleetDegraded"


def pressure_rule() -> AlertRule:
    return AlertRule(
        name=PRESSURE,
        expr=lambda c: (
            f"sum {c.by()} ({c.select(catalog.VLLM_NUM_REQUESTS_WAITING)}) >= {QUEUE_PRESSURE}"
        ),
        for_="2s",
        # Held while the engine's stop_admission drains its queue, so the lease does not flap.
        keep_firing_for="15s",
        severity="warning",
        action="stop_admission",
        params={catalog.PARAM_RETRY_AFTER: "1"},
        summary="Requests queue on one engine (fleet test).",
        description="{{ $value }} requests wait on {{ $labels.instance }}.",
        dashboard=DASHBOARD_FLEET,
    )


def rules_text() -> str:
    """warden's recording rules and fleet alert (its ``for`` shortened), and the test rule."""
    alerts = [rule for rule in FLEET.rules if isinstance(rule, AlertRule)]
    fleet = RuleGroup(FLEET.name, tuple(replace(rule, for_="3s") for rule in alerts))
    groups = (RECORDING_RULES, FLEET_RECORDING, fleet, RuleGroup("fleet-test", (pressure_rule(),)))
    return dump_yaml({"groups": [group.to_group(CONFIG) for group in groups]})


@dataclass
class Fleet:
    engines: dict[str, EngineProcess]
    balancer: str
    relay_url: str
    pager: PagerServer
    model: str
    failures: list[str] = field(default_factory=list)

    def leases(self, name: str) -> list[dict[str, Any]]:
        state = httpx.get(f"{self.engines[name].base_url}/warden/state", timeout=15).json()
        return [lease for lease in state["leases"] if lease["source"] == "alertmanager"]

    def metric(self, name: str, spec: catalog.MetricSpec, **labels: str) -> float:
        return sample(scrape(self.engines[name]), spec.name, **labels)

    def complete(self, base_url: str, max_tokens: int = 8, **extra: Any) -> httpx.Response:
        body = {"model": self.model, "prompt": "fleet", "max_tokens": max_tokens, **extra}
        return httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)

    def through_balancer(self, count: int) -> list[tuple[int, str]]:
        """``count`` requests one after the other: (status, engine that answered)."""
        answers = []
        for _ in range(count):
            response = self.complete(self.balancer)
            answers.append((response.status_code, response.headers.get(SERVED_BY, "?")))
        return answers

    def fleet_pages(self, status: str) -> list[dict[str, Any]]:
        return [
            page
            for page in self.pager.pages()
            if page["status"] == status
            and any(a["labels"]["alertname"] == FLEET_ALERT for a in page["alerts"])
        ]


@contextlib.contextmanager
def engines(model: Path, work: Path, token_file: Path) -> Iterator[dict[str, EngineProcess]]:
    """The engines, started together (each ~25 s alone on two cores), each knowing its
    identity as a Kubernetes pod would (downward API): instance, namespace, cluster."""
    started: dict[str, EngineProcess] = {}
    try:
        for name in NAMES:
            run_dir = work / name
            run_dir.mkdir()
            env = {
                **ENGINE_ENV,
                "WARDEN_WEBHOOK_TOKEN_FILE": str(token_file),
                "WARDEN_INSTANCE": f"engine-{name}",
                "WARDEN_NAMESPACE": NAMESPACE,
                "WARDEN_CLUSTER": CLUSTER,
            }
            spec = LaunchSpec(
                str(model), port=free_port(), extra_args=list(ENGINE_ARGS), env=env, run_dir=run_dir
            )
            started[name] = EngineProcess(spec, log_path=run_dir / "engine.log")
            started[name].start()
        for engine in started.values():
            engine.wait_ready(600)
        yield started
    finally:
        for engine in started.values():
            engine.stop(30.0)
            engine.close()


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    token_file = work / "token"
    token_file.write_text(TOKEN + "\n")
    mixin_file = work / "mixin.yaml"
    mixin_file.write_text(dump_yaml(CONFIG.model_dump(mode="json")))
    rules = work / "rules.yml"
    rules.write_text(rules_text())
    pager = PagerServer(work / "pages.jsonl", "127.0.0.1", free_port()).start()
    relay_port = free_port()
    relay_url = f"http://127.0.0.1:{relay_port}"
    with engines(tiny_model, work, token_file) as running:
        am_config = render_alertmanager_config(
            f"{relay_url}/warden/alertmanager",
            str(token_file),
            pager.url,
            engine_timing=ENGINE_TIMING,
            pager_timing=PAGER_TIMING,
            config=CONFIG,
        )
        with running_alertmanager(am_config, work / "alertmanager") as alertmanager:

            def fleet_scrape_config(config: dict[str, Any]) -> None:
                config["global"]["external_labels"] = {"cluster": CLUSTER}
                config["scrape_configs"] = [
                    {
                        "job_name": JOB,
                        "static_configs": [
                            {
                                "targets": [f"127.0.0.1:{engine.spec.port}"],
                                # Named as a Kubernetes PodMonitor names pods.
                                "labels": {"instance": f"engine-{name}", "namespace": NAMESPACE},
                            }
                            for name, engine in running.items()
                        ],
                    },
                    {
                        "job_name": "warden-relay",
                        "static_configs": [{"targets": [f"127.0.0.1:{relay_port}"]}],
                    },
                    {
                        "job_name": "alertmanager",
                        "static_configs": [{"targets": [alertmanager.url.split("://")[1]]}],
                    },
                ]

            with running_prometheus(
                rule_files=[rules],
                alertmanager=alertmanager.url,
                workdir=work / "prometheus",
                edit_config=fleet_scrape_config,
            ) as prometheus:
                relay = ChildProcess(
                    "relay",
                    [sys.executable, "-m", "warden.cli", "relay", "--port", str(relay_port)]
                    + ["--prometheus", prometheus.url, "--config", str(mixin_file)],
                    work / "relay.log",
                    f"{relay_url}/-/ready",
                    env={**os.environ, "WARDEN_WEBHOOK_TOKEN_FILE": str(token_file)},
                )
                relay.start()
                servers = {name: f"127.0.0.1:{e.spec.port}" for name, e in running.items()}
                try:
                    prometheus.wait_for_targets_up(timeout=60)
                    relay.wait_ready(60)
                    with running_haproxy(servers, work / "haproxy") as balancer:
                        yield Fleet(running, balancer, relay_url, pager, str(tiny_model))
                finally:
                    relay.stop()
                    pager.stop()


class Pressure:
    """Clients sending long requests straight to one engine, each until the engine first
    refuses it (or the test stops them): pressure that ends once the engine protects itself,
    so it degrades once, not in cycles."""

    def __init__(self, fleet: Fleet, name: str) -> None:
        self.url = fleet.engines[name].base_url
        self.fleet = fleet
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.threads = [threading.Thread(target=self._run) for _ in range(PRESSURE_CLIENTS)]

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                status = self.fleet.complete(self.url, max_tokens=96, ignore_eos=True).status_code
            except httpx.HTTPError:
                status = 0
            self.statuses.append(status)
            if status != 200:
                return

    def __enter__(self) -> Pressure:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(180)


def lease_names(fleet: Fleet, name: str) -> set[str]:
    return {lease.get("alertname", "") for lease in fleet.leases(name)}


def test_pressure_on_one_engine_degrades_it_alone_and_the_fleet_keeps_serving(
    fleet: Fleet,
) -> None:
    # Every engine serves through the balancer to begin with.
    seen = {served for status, served in fleet.through_balancer(4) if status == 200}
    assert seen == set(NAMES), f"round robin should reach every engine, got {seen}"

    with Pressure(fleet, "b") as pressure:
        wait_until(lambda: PRESSURE in lease_names(fleet, "b"), 120, 0.5, "B's alert lease")
        pressure.stop.set()  # what is queued on B drains while its lease holds
        lease = next(x for x in fleet.leases("b") if x.get("alertname") == PRESSURE)
        assert lease["action"] == "stop_admission"
        for other in OTHERS:
            assert fleet.leases(other) == [], f"{other} was degraded too"

        # While B refuses new work, the balancer's clients are all answered, by A. Round robin
        # sends every second request to B: four reach it twice, and all four are done well
        # within the lease's hold (``keep_firing_for``) on a loaded machine.
        refused_before = fleet.metric("b", catalog.ADMISSION_REJECTIONS, reason="stop_admission")
        answers = fleet.through_balancer(4)
        assert PRESSURE in lease_names(fleet, "b"), "B's lease ended during the check"
        assert all(status == 200 for status, _ in answers), answers
        assert {served for _, served in answers} <= set(OTHERS), answers
        refused = fleet.metric("b", catalog.ADMISSION_REJECTIONS, reason="stop_admission")
        assert refused > refused_before, "the balancer never tried B: nothing was shown"

        # The fleet-wide alert pages, once, with no instance.
        page = wait_until(lambda: fleet.fleet_pages("firing"), 60, 0.5, "the fleet page")[0]
        fleet_alerts = [a for a in page["alerts"] if a["labels"]["alertname"] == FLEET_ALERT]
        assert len(fleet_alerts) == 1
        assert "instance" not in fleet_alerts[0]["labels"]
        assert fleet_alerts[0]["labels"]["job"] == JOB
        assert fleet_alerts[0]["labels"]["namespace"] == NAMESPACE

    assert 200 in pressure.statuses
    # The pressure is over: the resolved notification reaches B and releases it.
    wait_until(lambda: PRESSURE not in lease_names(fleet, "b"), 120, 0.5, "B's release")
    assert fleet.complete(fleet.engines["b"].base_url).status_code == 200
    wait_until(lambda: fleet.fleet_pages("resolved"), 60, 0.5, "the fleet page's resolution")
    assert len(fleet.fleet_pages("firing")) == 1, "a fleet-wide problem paged more than once"

    # Nothing was ever delivered to A; B got the firing and the resolved notification.
    for other in OTHERS:
        assert fleet.metric(other, catalog.WEBHOOK_NOTIFICATIONS) == 0
    assert fleet.metric("b", catalog.WEBHOOK_NOTIFICATIONS, outcome="applied") >= 2
    assert fleet.metric("b", catalog.WEBHOOK_NOTIFICATIONS, outcome="not_for_this_engine") == 0
    relay = httpx.get(f"{fleet.relay_url}/metrics", timeout=10).text
    assert "warden_relay_deliveries_total" in relay
    print(f"\nfleet test: pressure statuses {pressure.statuses}, balancer answers {answers}")
