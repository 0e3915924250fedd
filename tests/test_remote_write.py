"""Beyond one Prometheus (#12 item 6): remote_write to a real VictoriaMetrics.

A Prometheus scrapes two engines' warden metrics (warden's real webhook/controller without a
model: tests/support/webhook_engine.py) and VictoriaMetrics' own metrics, evaluates warden's
fleet recording rules, and ships with ``warden.stack.remote_write.remote_write_entry`` (the
entry docs/fleets.md documents). In the store: every engine's series with its identity
(instance, namespace, and the cluster external label), the fleet recording rules with the same
answers to the same PromQL as Prometheus gives, and nothing that is not warden's (the filter).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from alerts.config import MixinConfig
from alerts.fleet import ENGINES_UP, FLEET_RECORDING
from alerts.yamltext import dump_yaml
from dashboards.promapi import PrometheusAPI
from exporter import catalog
from tests.support.prometheus import PrometheusServer, prometheus_available, running_prometheus
from tests.support.victoriametrics import running_victoria_metrics, victoria_metrics_available
from warden.common.ports import free_port
from warden.common.processes import ChildProcess
from warden.common.waiting import wait_until
from warden.stack.remote_write import remote_write_entry

pytestmark = pytest.mark.skipif(
    not (prometheus_available() and victoria_metrics_available()),
    reason="prometheus and victoria-metrics are needed (apt-get install -y victoria-metrics)",
)

JOB = "vllm-remote"
CLUSTER = "cluster-east"
NAMESPACE = "serving"
ENGINES = ("engine-0", "engine-1")
CONFIG = MixinConfig(engine_selector=f'job="{JOB}"')


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, str]]:
    work = tmp_path_factory.mktemp("remote-write")
    token_file = work / "token"
    token_file.write_text("remote-write-test-token-0123456789\n")
    rules = work / "rules.yml"
    rules.write_text(dump_yaml({"groups": [FLEET_RECORDING.to_group(CONFIG)]}))
    engines: list[ChildProcess] = []
    try:
        addresses = {}
        for name in ENGINES:
            port = free_port()
            child = ChildProcess(
                name,
                [sys.executable, "-m", "tests.support.webhook_engine", "--port", str(port)],
                work / f"{name}.log",
                f"http://127.0.0.1:{port}/warden/state",
                env={**os.environ, "WARDEN_WEBHOOK_TOKEN_FILE": str(token_file)},
            )
            child.start()
            engines.append(child)
            addresses[name] = f"127.0.0.1:{port}"
        for child in engines:
            child.wait_ready(60)
        with running_victoria_metrics(work / "vm") as vm:

            def ship(config: dict[str, Any]) -> None:
                config["global"]["external_labels"] = {"cluster": CLUSTER}
                config["remote_write"] = [remote_write_entry(f"{vm}/api/v1/write")]
                config["scrape_configs"] = [
                    {
                        "job_name": JOB,
                        "static_configs": [
                            {
                                "targets": [address],
                                "labels": {"instance": name, "namespace": NAMESPACE},
                            }
                            for name, address in addresses.items()
                        ],
                    },
                    # Not warden's: what the filter keeps out of the store.
                    {
                        "job_name": "victoria-metrics",
                        "static_configs": [{"targets": [vm.split("://")[1]]}],
                    },
                ]

            with running_prometheus(
                rule_files=[rules], workdir=work / "prometheus", edit_config=ship
            ) as prometheus:
                yield prometheus, vm
    finally:
        for child in engines:
            child.stop()


def test_the_store_holds_every_engines_series_with_its_identity(
    stores: tuple[PrometheusServer, str],
) -> None:
    _, vm = stores
    gauge = catalog.DEGRADATION_ACTIVE.name
    with PrometheusAPI(vm) as store:

        def identities() -> set[tuple[str, str, str]]:
            query = f'count by (instance, namespace, cluster) ({gauge}{{job="{JOB}"}})'
            return {
                (s["metric"]["instance"], s["metric"]["namespace"], s["metric"]["cluster"])
                for s in store.query(query)
            }

        wanted = {(name, NAMESPACE, CLUSTER) for name in ENGINES}
        wait_until(lambda: identities() == wanted, 90, 1.0, "engine series in VictoriaMetrics")


def test_fleet_recording_rules_reach_the_store_and_answer_as_in_prometheus(
    stores: tuple[PrometheusServer, str],
) -> None:
    prometheus, vm = stores
    with PrometheusAPI(vm) as store, PrometheusAPI(prometheus.url) as local:

        def up(api: PrometheusAPI) -> list[tuple[dict[str, str], float]]:
            query = f'{ENGINES_UP}{{job="{JOB}"}}'
            return [(s["metric"], float(s["value"][1])) for s in api.query(query)]

        def both_say_two() -> bool:
            answers = up(store), up(local)
            return all(len(a) == 1 and a[0][1] == len(ENGINES) for a in answers)

        wait_until(both_say_two, 90, 1.0, "the fleet recording rule in both stores")
        (labels, _), ((local_labels, _),) = up(store)[0], up(local)
        # The store adds the cluster (external label); otherwise the same series.
        assert labels == {**local_labels, "cluster": CLUSTER}
        assert labels["job"] == JOB and labels["namespace"] == NAMESPACE


def test_only_warden_series_are_shipped(stores: tuple[PrometheusServer, str]) -> None:
    prometheus, vm = stores
    foreign = 'vm_app_uptime_seconds{job="victoria-metrics"}'
    with PrometheusAPI(vm) as store, PrometheusAPI(prometheus.url) as local:
        wait_until(lambda: store.query('up{job="victoria-metrics"}'), 90, 1.0, "up in the store")
        assert local.query(foreign), "the foreign series is scraped: the filter has work to do"
        assert store.query(foreign) == []
