"""A real Alertmanager for tests: the given config, private storage, always stopped."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx

from warden.common.metrics_text import parse_samples, sample
from warden.common.ports import free_port
from warden.common.processes import ChildProcess

ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")


def webhook_notification(*alerts: dict, receiver: str = "engine") -> dict:
    """A firing webhook notification as Alertmanager (version 4) sends it, with these alerts."""
    return {
        "version": "4",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": receiver,
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager",
        "alerts": list(alerts),
    }


def alertmanager_binary() -> str | None:
    return next((shutil.which(b) for b in ALERTMANAGER_BINARIES if shutil.which(b)), None)


class RunningAlertmanager:
    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir

    def post_alerts(self, *alerts: dict) -> None:
        """Alerts as Prometheus would send them (``/api/v2/alerts``)."""
        httpx.post(f"{self.url}/api/v2/alerts", json=list(alerts), timeout=5).raise_for_status()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples on Alertmanager's own /metrics with these labels."""
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        return sample(parse_samples(text), name, **labels)


@contextlib.contextmanager
def running_alertmanager(config_text: str, workdir: Path) -> Iterator[RunningAlertmanager]:
    binary = alertmanager_binary()
    if binary is None:
        raise RuntimeError("no prometheus-alertmanager binary on PATH")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "alertmanager.yml"
    config.write_text(config_text, encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    child = ChildProcess(
        "alertmanager",
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        workdir / "alertmanager.log",
        f"{url}/-/ready",
    )
    child.start()
    try:
        child.wait_ready(30)
        yield RunningAlertmanager(url, workdir)
    finally:
        child.stop(timeout_s=10)
