"""warden relay (#12 item 2): one Alertmanager receiver, each alert to the engine it names.

Real components: Prometheus discovering the engines from a file (as a fleet grows), a real
Alertmanager whose config never changes, ``warden relay`` as its own process, and warden's real
webhook, leases and policy in one process per engine (tests/support/webhook_engine.py: warden
without a model, so five engines fit on two cores; the fleet test runs real vLLM engines).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from alerts.alertmanager import RouteTiming, render_alertmanager_config
from exporter import catalog
from tests.support.alertmanager import (
    RunningAlertmanager,
    alertmanager_binary,
    running_alertmanager,
)
from tests.support.prometheus import PrometheusServer, prometheus_available, running_prometheus
from warden.common.metrics_text import parse_samples, sample
from warden.common.ports import free_port
from warden.common.processes import ChildProcess
from warden.common.waiting import wait_until
from warden.stack.pager import PagerServer

TOKEN = "relay-test-token-0123456789"
FAST = RouteTiming("300ms", "1s", "1m")
JOB = "vllm-warden"


# --- a fleet, for real --------------------------------------------------------------------------
pytestmark = pytest.mark.skipif(
    not (prometheus_available() and alertmanager_binary()),
    reason="prometheus and prometheus-alertmanager are needed",
)


@dataclass
class Fleet:
    work: Path
    token_file: Path
    prometheus: PrometheusServer
    alertmanager: RunningAlertmanager
    relay_url: str
    pager: PagerServer
    engines: dict[str, tuple[ChildProcess, str]] = field(default_factory=dict)

    @property
    def targets_file(self) -> Path:
        return self.work / "targets.json"

    def start_engine(self, name: str) -> str:
        port = free_port()
        address = f"127.0.0.1:{port}"
        child = ChildProcess(
            f"engine-{name}",
            [sys.executable, "-m", "tests.support.webhook_engine", "--port", str(port)],
            self.work / f"engine-{name}.log",
            f"http://{address}/warden/state",
            env={**os.environ, "WARDEN_WEBHOOK_TOKEN_FILE": str(self.token_file)},
        )
        child.start()
        child.wait_ready(60)
        self.engines[name] = (child, address)
        return address

    def publish_targets(self) -> None:
        """What service discovery does when the fleet changes: Prometheus re-reads the file."""
        groups = [{"targets": [a for _, a in self.engines.values()], "labels": {"job": JOB}}]
        scratch = self.targets_file.with_suffix(".tmp")
        scratch.write_text(json.dumps(groups))
        scratch.replace(self.targets_file)
        wanted = {a for _, a in self.engines.values()}

        def discovered() -> bool:
            return {t["labels"]["instance"] for t in self.prometheus.targets()} == wanted

        wait_until(discovered, 60, 0.3, "Prometheus to discover the engines")

    def address(self, name: str) -> str:
        return self.engines[name][1]

    def leases(self, name: str) -> list[dict[str, Any]]:
        state = httpx.get(f"http://{self.address(name)}/warden/state", timeout=10).json()
        return [lease for lease in state["leases"] if lease["source"] == "alertmanager"]

    def webhook_calls(self, name: str) -> float:
        text = httpx.get(f"http://{self.address(name)}/metrics", timeout=10).text
        return sample(parse_samples(text), catalog.WEBHOOK_NOTIFICATIONS.name)

    def relay_metric(self, spec: catalog.MetricSpec, **labels: str) -> float:
        text = httpx.get(f"{self.relay_url}/metrics", timeout=10).text
        return sample(parse_samples(text), spec.name, **labels)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("relay-fleet")
    token_file = work / "token"
    token_file.write_text(TOKEN + "\n")
    targets = work / "targets.json"
    targets.write_text("[]")

    def discover_from_file(config: dict[str, Any]) -> None:
        config["scrape_configs"] = [
            {
                "job_name": JOB,
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
            }
        ]

    pager = PagerServer(work / "pages.jsonl", "127.0.0.1", free_port()).start()
    relay_port = free_port()
    relay_url = f"http://127.0.0.1:{relay_port}"
    with running_prometheus(workdir=work / "prometheus", edit_config=discover_from_file) as prom:
        am_config = render_alertmanager_config(
            f"{relay_url}/warden/alertmanager",
            str(token_file),
            pager.url,
            engine_timing=FAST,
            pager_timing=FAST,
        )
        with running_alertmanager(am_config, work / "alertmanager") as alertmanager:
            relay = ChildProcess(
                "relay",
                [sys.executable, "-m", "warden.cli", "relay", "--port", str(relay_port)]
                + ["--prometheus", prom.url, "--refresh-s", "60"],
                work / "relay.log",
                f"{relay_url}/-/healthy",
                env={**os.environ, "WARDEN_WEBHOOK_TOKEN_FILE": str(token_file)},
            )
            relay.start()
            fleet = Fleet(work, token_file, prom, alertmanager, relay_url, pager)
            try:
                relay.wait_ready(60)
                for name in ("a", "b", "c"):
                    fleet.start_engine(name)
                fleet.publish_targets()
                yield fleet
            finally:
                relay.stop()
                for child, _ in fleet.engines.values():
                    child.stop()
                pager.stop()


def am_alert(instance: str | None, name: str, *, resolved: bool = False, **labels: str) -> dict:
    now = datetime.now(UTC)
    alert_labels = {
        "alertname": name,
        "severity": "warning",
        catalog.ACTION_LABEL: "stop_admission",
        **labels,
    }
    if instance is not None:
        alert_labels["instance"] = instance
    ends = now - timedelta(seconds=1) if resolved else now + timedelta(minutes=10)
    return {
        "labels": alert_labels,
        "annotations": {"summary": "relay test"},
        "startsAt": (now - timedelta(minutes=1)).isoformat(),
        "endsAt": ends.isoformat(),
    }


def wait_leases(fleet: Fleet, engine: str, alertname: str, present: bool = True) -> None:
    def there() -> bool:
        names = {lease.get("alertname") for lease in fleet.leases(engine)}
        return (alertname in names) is present

    wait_until(there, 30, 0.2, f"{alertname} lease on {engine}: {present}")


def test_each_alert_reaches_only_the_engine_it_names(fleet: Fleet) -> None:
    before = {name: fleet.webhook_calls(name) for name in ("a", "c")}
    fleet.alertmanager.post_alerts(am_alert(fleet.address("b"), "WardenRelayB"))
    wait_leases(fleet, "b", "WardenRelayB")
    assert fleet.relay_metric(catalog.RELAY_ALERTS, outcome="forwarded") >= 1
    for name in ("a", "c"):
        assert fleet.leases(name) == []
        assert fleet.webhook_calls(name) == before[name], f"{name} was called"
    # The resolved notification releases it, on b only.
    fleet.alertmanager.post_alerts(am_alert(fleet.address("b"), "WardenRelayB", resolved=True))
    wait_leases(fleet, "b", "WardenRelayB", present=False)


def test_scaling_from_three_to_five_engines_needs_no_alertmanager_change(fleet: Fleet) -> None:
    status = httpx.get(f"{fleet.alertmanager.url}/api/v2/status", timeout=10).json()
    config_before = status["config"]["original"]
    for name in ("d", "e"):
        fleet.start_engine(name)
    fleet.publish_targets()  # the fleet grew; the relay's cached list did not (refresh 60 s)
    fleet.alertmanager.post_alerts(
        am_alert(fleet.address("d"), "WardenRelayScale"),
        am_alert(fleet.address("e"), "WardenRelayScale"),
    )
    wait_leases(fleet, "d", "WardenRelayScale")
    wait_leases(fleet, "e", "WardenRelayScale")
    for name in ("a", "b", "c"):
        assert "WardenRelayScale" not in {lease.get("alertname") for lease in fleet.leases(name)}
    status = httpx.get(f"{fleet.alertmanager.url}/api/v2/status", timeout=10).json()
    assert status["config"]["original"] == config_before
    assert fleet.relay_metric(catalog.RELAY_ENGINES) == 5


def test_an_engine_that_cannot_be_reached_fails_where_alertmanager_counts_it(
    fleet: Fleet,
) -> None:
    address = fleet.start_engine("gone")
    fleet.publish_targets()
    child, _ = fleet.engines["gone"]
    child.stop()  # still a target (down), no longer answering
    failed_before = fleet.alertmanager.metric(
        "alertmanager_notifications_failed_total", integration="webhook"
    )
    fleet.alertmanager.post_alerts(am_alert(address, "WardenRelayGone"))
    wait_until(
        lambda: (
            fleet.alertmanager.metric(
                "alertmanager_notifications_failed_total", integration="webhook"
            )
            > failed_before
        ),
        60,
        0.5,
        "Alertmanager to count the failed webhook notification",
    )
    assert fleet.relay_metric(catalog.RELAY_DELIVERIES, outcome="failed") >= 1
    assert fleet.relay_metric(catalog.RELAY_DELIVERIES, outcome="retried") >= 1
    assert fleet.relay_metric(catalog.RELAY_NOTIFICATIONS, outcome="failed") >= 1
    fleet.alertmanager.post_alerts(am_alert(address, "WardenRelayGone", resolved=True))
    del fleet.engines["gone"]
    fleet.publish_targets()


def relay_post(fleet: Fleet, body: bytes, token: str = TOKEN, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{fleet.relay_url}/warden/alertmanager",
        content=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", **headers},
        timeout=15,
    )


def notification(*alerts: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "version": "4",
            "groupKey": "{}:{}",
            "truncatedAlerts": 0,
            "status": "firing",
            "receiver": "warden-engine",
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager",
            "alerts": [
                {
                    "status": "firing",
                    "labels": a["labels"],
                    "annotations": {},
                    "startsAt": "2026-11-21T10:00:00Z",
                    "endsAt": "0001-01-01T00:00:00Z",
                    "generatorURL": "",
                    "fingerprint": f"fp{index}",
                }
                for index, a in enumerate(alerts)
            ],
        }
    ).encode()


def test_the_relay_checks_everything_before_it_forwards(fleet: Fleet) -> None:
    calls = {name: fleet.webhook_calls(name) for name in ("a", "b", "c")}
    valid = notification(am_alert(fleet.address("a"), "WardenRelayDirect"))
    assert relay_post(fleet, valid, token="wrong").status_code == 401
    assert relay_post(fleet, b"{not json").status_code == 400
    assert relay_post(fleet, valid, **{"Content-Type": "text/plain"}).status_code == 415
    bad_action = notification(
        am_alert(fleet.address("a"), "WardenRelayDirect", **{catalog.PARAM_RETRY_AFTER: "soon"})
    )
    # A bad alert alone is refused on its own, named in a 200 (Alertmanager never retries a
    # 4xx, and the notification's other alerts must still travel); nothing bad is forwarded.
    answer = relay_post(fleet, bad_action)
    assert answer.status_code == 200, answer.text
    assert "warden_retry_after" in answer.json()["rejected"][0]["problem"]
    assert relay_post(fleet, b"[" * 100_000 + b"]" * 100_000).status_code == 400
    assert {name: fleet.webhook_calls(name) for name in calls} == calls, "something was forwarded"

    nobody = notification(
        am_alert(None, "WardenRelayFleetWide"), am_alert("127.0.0.1:1", "WardenRelayNobody")
    )
    answer = relay_post(fleet, nobody)
    assert answer.status_code == 200, answer.text
    assert answer.json()["alerts"] == {"fleet_wide": 1, "unresolved": 1}
    assert {name: fleet.webhook_calls(name) for name in calls} == calls
