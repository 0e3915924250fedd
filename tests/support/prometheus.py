"""A real Prometheus server for tests: generated config, private storage, guaranteed cleanup.

Tests that need PromQL evaluated for real (dashboards, alert rules, end-to-end loops) start the
``prometheus`` binary on PATH instead of faking it::

    with running_prometheus([engine.metrics_url], rule_files=[rules]) as prom:
        prom.wait_for_targets_up()
        prom.wait_for("vllm:num_requests_running")
        rows = prom.query('sum(rate(warden_requests_total[1m]))')

Scrape and rule evaluation run every second by default so a test sees data within seconds.
Each server gets a free port on 127.0.0.1 and a fresh storage directory; the process is killed
when the ``with`` block ends, whatever happened inside it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

PROMETHEUS_BINARY = "prometheus"

Sample = dict[str, Any]  # one element of a query result: {"metric": {...}, "value"|"values": ...}


class PrometheusError(RuntimeError):
    """Prometheus did not start, or answered a query with an error (e.g. bad PromQL)."""


def prometheus_available(binary: str = PROMETHEUS_BINARY) -> bool:
    """Whether the binary is on PATH; use it to skip tests on machines without Prometheus."""
    return shutil.which(binary) is not None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class ScrapeTarget:
    """One endpoint to scrape, given as its full metrics URL (``http://host:port/metrics``)."""

    url: str
    job: str = "vllm"
    labels: Mapping[str, str] = field(default_factory=dict)
    # Prometheus metric_relabel_configs rules, applied to every scraped sample.
    metric_relabel_configs: Sequence[Mapping[str, Any]] = ()

    def scrape_config(self, index: int, interval: str) -> dict[str, Any]:
        parts = urlsplit(self.url)
        if not parts.scheme or not parts.netloc:
            raise ValueError(f"scrape target needs a full URL, got {self.url!r}")
        static: dict[str, Any] = {"targets": [parts.netloc]}
        if self.labels:
            static["labels"] = dict(self.labels)
        return {
            # Unique per target, so two targets can share a job name.
            "job_name": f"{self.job}-{index}" if index else self.job,
            "scheme": parts.scheme,
            "metrics_path": parts.path or "/metrics",
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "static_configs": [static],
            # Keep the job label the caller asked for, whatever the job_name.
            "relabel_configs": [{"target_label": "job", "replacement": self.job}],
            "metric_relabel_configs": [dict(rule) for rule in self.metric_relabel_configs],
        }


def prometheus_config(
    targets: Sequence[ScrapeTarget],
    rule_files: Sequence[Path] = (),
    alertmanager: str | None = None,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
) -> dict[str, Any]:
    """The prometheus.yml as a dict: global intervals, scrape jobs, rules, Alertmanager."""
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": evaluation_interval,
        },
        "scrape_configs": [t.scrape_config(i, scrape_interval) for i, t in enumerate(targets)],
    }
    if rule_files:
        config["rule_files"] = [str(Path(p).resolve()) for p in rule_files]
    if alertmanager:
        parts = urlsplit(alertmanager if "://" in alertmanager else f"http://{alertmanager}")
        config["alerting"] = {
            "alertmanagers": [
                {
                    "scheme": parts.scheme,
                    "path_prefix": parts.path or "/",
                    "static_configs": [{"targets": [parts.netloc]}],
                }
            ]
        }
    return config


class PrometheusServer:
    """A running Prometheus and small clients for its HTTP API. Build it with
    ``running_prometheus``; the attributes say where its files live, for debugging."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, workdir: Path) -> None:
        self.process = process
        self.port = port
        self.workdir = workdir
        self.config_path = workdir / "prometheus.yml"
        self.log_path = workdir / "prometheus.log"
        self.url = f"http://127.0.0.1:{port}"
        self._http = httpx.Client(base_url=self.url, timeout=30.0)

    # --- HTTP API ----------------------------------------------------------------------------
    def api(self, path: str, **params: Any) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; raise ``PrometheusError`` on error."""
        response = self._http.get(f"/api/v1/{path}", params=params)
        try:
            body = response.json()
        except ValueError as exc:
            raise PrometheusError(f"{path}: HTTP {response.status_code}: {response.text}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """Instant query; the result list (vector samples, or one scalar as a sample)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self.api("query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(
        self, expr: str, start: float, end: float, step: float | str = 1.0
    ) -> list[Sample]:
        """Range query; one ``{"metric", "values"}`` per series."""
        data = self.api("query_range", query=expr, start=start, end=end, step=step)
        return list(data["result"])

    def value(self, expr: str) -> float | None:
        """The single value of an instant query, or None when it returns nothing."""
        result = self.query(expr)
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusError(f"{expr!r} returned {len(result)} series, expected one")
        return float(result[0]["value"][1])

    def series(self, match: str) -> list[dict[str, str]]:
        """Label sets of the series matching a selector (``/api/v1/series``)."""
        return list(self.api("series", **{"match[]": match}))

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts currently pending or firing."""
        return list(self.api("alerts")["alerts"])

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self.api("rules")["groups"])

    # --- Waiting -----------------------------------------------------------------------------
    def wait_for(
        self,
        expr: str,
        timeout: float = 30.0,
        until: Callable[[list[Sample]], bool] = bool,
        interval: float = 0.5,
    ) -> list[Sample]:
        """Poll an instant query until ``until(result)`` holds (default: non-empty)."""
        deadline = time.monotonic() + timeout
        result: list[Sample] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if until(result):
                return result
            time.sleep(interval)
        raise TimeoutError(f"{expr!r} still {result!r} after {timeout:.0f}s")

    def wait_for_targets_up(self, timeout: float = 30.0) -> None:
        """Until every configured target was scraped successfully at least once."""
        deadline = time.monotonic() + timeout
        targets: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            targets = self.targets()
            if targets and all(t.get("health") == "up" for t in targets):
                return
            time.sleep(0.5)
        states = [(t.get("scrapeUrl"), t.get("health"), t.get("lastError")) for t in targets]
        raise TimeoutError(f"targets not up after {timeout:.0f}s: {states}")

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    # --- Lifecycle ---------------------------------------------------------------------------
    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if self._http.get("/-/ready", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate, then kill if it lingers. Safe to call twice."""
        self._http.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)


def _as_target(target: str | ScrapeTarget) -> ScrapeTarget:
    return target if isinstance(target, ScrapeTarget) else ScrapeTarget(target)


@contextlib.contextmanager
def running_prometheus(
    targets: Sequence[str | ScrapeTarget] = (),
    *,
    rule_files: Sequence[Path] = (),
    alertmanager: str | None = None,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    workdir: Path | None = None,
    ready_timeout: float = 30.0,
    extra_args: Sequence[str] = (),
    binary: str = PROMETHEUS_BINARY,
) -> Iterator[PrometheusServer]:
    """Start Prometheus, yield it once ``/-/ready`` answers, always stop it afterwards.

    ``targets``: metrics URLs (job ``vllm``) or ``ScrapeTarget``s. ``rule_files``: recording
    and alerting rule files, checked by Prometheus at start (a bad file fails the start).
    ``alertmanager``: ``host:port`` or URL of an Alertmanager to send alerts to. ``workdir``:
    where config, TSDB and log go (default: a temporary directory removed afterwards).
    """
    owned_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="warden-prometheus-")) if workdir is None else workdir
    root.mkdir(parents=True, exist_ok=True)
    config = prometheus_config(
        [_as_target(t) for t in targets],
        rule_files,
        alertmanager,
        scrape_interval,
        evaluation_interval,
    )
    (root / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    server: PrometheusServer | None = None
    try:
        for attempt in range(3):  # a free port can be taken between probing and binding
            port = free_port()
            argv = [
                binary,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
                *extra_args,
            ]
            with open(root / "prometheus.log", "ab") as log:
                process = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)
                )
            server = PrometheusServer(process, port, root)
            try:
                server.wait_ready(ready_timeout)
                break
            except PrometheusError:
                server.stop()
                if attempt == 2 or "address already in use" not in server.log_tail():
                    raise
        assert server is not None
        yield server
    finally:
        if server is not None:
            server.stop()
        if owned_dir:
            shutil.rmtree(root, ignore_errors=True)
