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
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from dashboards.promapi import PrometheusAPI, Sample
from warden.common.ports import free_port
from warden.common.processes import http_ok
from warden.common.waiting import WaitAborted, wait_until

PROMETHEUS_BINARY = "prometheus"


class PrometheusError(RuntimeError):
    """Prometheus did not start (API errors are ``dashboards.promapi.QueryError``)."""


def prometheus_available(binary: str = PROMETHEUS_BINARY) -> bool:
    """Whether the binary is on PATH; use it to skip tests on machines without Prometheus."""
    return shutil.which(binary) is not None


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


class PrometheusServer(PrometheusAPI):
    """A running Prometheus, and the client for its HTTP API (``dashboards.promapi``: query,
    query_range, series, alerts, targets, rule_groups). Build it with ``running_prometheus``;
    the attributes say where its files live, for debugging."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, workdir: Path) -> None:
        self.process = process
        self.port = port
        self.workdir = workdir
        self.config_path = workdir / "prometheus.yml"
        self.log_path = workdir / "prometheus.log"
        self.url = f"http://127.0.0.1:{port}"
        super().__init__(self.url)

    # --- Reading -----------------------------------------------------------------------------
    def value(self, expr: str) -> float | None:
        """The single value of an instant query, or None when it returns nothing."""
        result = self.query(expr)
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusError(f"{expr!r} returned {len(result)} series, expected one")
        return float(result[0]["value"][1])

    # --- Waiting -----------------------------------------------------------------------------
    def wait_for(
        self,
        expr: str,
        timeout: float = 30.0,
        until: Callable[[list[Sample]], bool] = bool,
        interval: float = 0.5,
    ) -> list[Sample]:
        """Poll an instant query until ``until(result)`` holds (default: non-empty)."""
        last: list[Sample] = []

        def holds() -> tuple[list[Sample]] | None:  # a tuple: an empty result can be awaited
            nonlocal last
            last = self.query(expr)
            return (last,) if until(last) else None

        try:
            return wait_until(holds, timeout, interval, what=repr(expr))[0]
        except TimeoutError:
            raise TimeoutError(f"{expr!r} still {last!r} after {timeout:.0f}s") from None

    def wait_for_targets_up(self, timeout: float = 30.0) -> None:
        """Until every configured target was scraped successfully at least once."""
        targets: list[dict[str, Any]] = []

        def all_up() -> bool:
            nonlocal targets
            targets = self.targets()
            return bool(targets) and all(t.get("health") == "up" for t in targets)

        try:
            wait_until(all_up, timeout, 0.5, what="targets up")
        except TimeoutError:
            states = [(t.get("scrapeUrl"), t.get("health"), t.get("lastError")) for t in targets]
            raise TimeoutError(f"targets not up after {timeout:.0f}s: {states}") from None

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    # --- Lifecycle ---------------------------------------------------------------------------
    def wait_ready(self, timeout: float) -> None:
        try:
            wait_until(
                lambda: http_ok(f"{self.url}/-/ready"),
                timeout,
                0.2,
                what="prometheus ready",
                abort=lambda: self.process.poll() is not None,
            )
        except WaitAborted:
            raise PrometheusError(
                f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}"
            ) from None
        except TimeoutError:
            raise PrometheusError(
                f"prometheus not ready after {timeout:.0f}s:\n{self.log_tail()}"
            ) from None

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate, then kill if it lingers. Safe to call twice."""
        self.close()
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
    edit_config: Callable[[dict[str, Any]], None] | None = None,
) -> Iterator[PrometheusServer]:
    """Start Prometheus, yield it once ``/-/ready`` answers, always stop it afterwards.

    ``targets``: metrics URLs (job ``vllm``) or ``ScrapeTarget``s. ``rule_files``: recording
    and alerting rule files, checked by Prometheus at start (a bad file fails the start).
    ``alertmanager``: ``host:port`` or URL of an Alertmanager to send alerts to. ``workdir``:
    where config, TSDB and log go (default: a temporary directory removed afterwards).
    ``edit_config``: changes the config dict in place before it is written (file-based
    discovery, external labels, remote_write).
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
    if edit_config is not None:
        edit_config(config)
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
